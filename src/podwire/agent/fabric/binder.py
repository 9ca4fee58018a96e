"""Binder: desired ports in etcd -> shared plumbing in the kernel -> port state in etcd.

With ``agent.dataplane = "none"`` (no host netlink) the kernel steps are skipped and a port
counts as wired once planned: the node's etcd side alone, for many-node runs on one machine.

One task consumes the list-then-watch of ``/podwire/nodes/<host>/ports/`` in order; kernel
work goes to the host netlink workers. CNI ADDs wait here (``wait_wired``) until the port they
were handed is wired, so a pod is never plugged into a bridge that does not exist yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from podwire import keys
from podwire.agent import naming
from podwire.agent.fabric import plumbing
from podwire.agent.fabric.peers import PeerView
from podwire.agent.fabric.plumbing import NetworkPlan
from podwire.agent.metrics import AgentMetrics
from podwire.backoff import Backoff, retry_forever
from podwire.errors import PermanentError, PodwireError, RetryableError
from podwire.etcd import EtcdClient, PrefixWatcher, WatchBatch
from podwire.log import get_logger
from podwire.netlink import HostNetlink, RemoteMac
from podwire.schema import nodes as values
from podwire.schema.ports import DesiredPort, parse_desired_port

log = get_logger(__name__)

REMEMBER_REMOVED = 4096  # ports whose desired key went away, kept for ADDs still to ask


class PortNotWired(RetryableError):
    """The port is not wired on this host (yet): the forwarder has not sent it, or it failed."""


class PortVanished(PortNotWired):
    """The port's desired key went away before it was wired (Neutron deleted or unbound it):
    waiting cannot help, another port can."""


class PortNotWiredPermanent(PermanentError):
    """The binder tried and failed for a reason retrying will not fix."""


class PortDevices(Protocol):
    """Ports whose host device someone else makes (vif type ``tap``): the binder ensures their
    network, and this seam adopts the device and reports the port wired once it appears."""

    def handles(self, port: DesiredPort) -> bool: ...

    def bound(self, port: DesiredPort, bridge: str) -> None: ...

    def unbound(self, port_id: str) -> None: ...


@dataclass(frozen=True)
class BinderSettings:
    host: str
    vtep_ip: str
    physnet_mappings: dict[str, str]
    vlan_capable: bool
    retry_interval: float = 5.0
    repair_interval: float = 1.0  # how often the other nodes' kernel entries are read back


class Binder:
    def __init__(
        self,
        etcd: EtcdClient,
        host_nl: HostNetlink | None,
        settings: BinderSettings,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self._etcd = etcd
        self._metrics = metrics or AgentMetrics()
        self._nl = host_nl
        self._settings = settings
        self._desired: dict[str, bytes] = {}
        self.wired: dict[str, DesiredPort] = {}
        self.failed: dict[str, str] = {}
        self.removed: dict[str, None] = {}  # desired key deleted (oldest first), until put again
        self._plans: dict[str, NetworkPlan] = {}  # network id -> plumbing ensured on the host
        self._view = PeerView()
        self._view_known = False  # the peer tracker's first listing is in
        self._synced: dict[str, tuple[set[str], dict[str, RemoteMac]]] = {}  # vxlan device ->
        # Told of the remote MACs each VXLAN device may receive frames from (None: not every
        # peer says, so none is checked); the policy enforcer drops the others.
        self.on_remote: Callable[[dict[str, frozenset[str]] | None], None] | None = None
        self._kernel = asyncio.Lock()
        self._changed = asyncio.Condition()
        self.synced = asyncio.Event()
        # Told of every wired port's new desired value, in order (the policy enforcer follows
        # SG changes, then the memif service re-checks the port's path).
        self.port_listeners: list[Callable[[str, DesiredPort], None]] = []
        self.devices: PortDevices | None = None
        self.watcher = PrefixWatcher(etcd, keys.node_ports_prefix(settings.host))

    # -- running -------------------------------------------------------------------------

    async def run(self) -> None:
        follow = retry_forever("binder", self._follow, Backoff(0.2, 2.0), self.watcher.health)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(follow)
            tg.create_task(self._retry_failed())
            tg.create_task(self._repair_peers())

    async def _follow(self) -> None:
        """Apply the watch in order; after a failure half-way the watcher replays it all."""
        first = not self.synced.is_set()
        try:
            async with contextlib.aclosing(self.watcher.batches()) as batches:
                async for batch in batches:
                    await self._apply(batch)
                    if first or batch.relisted:
                        await self._reconcile_leftovers()
                        first = False
                        self.synced.set()
        except RetryableError:
            self.watcher.replay()
            raise

    async def _retry_failed(self) -> None:
        while True:
            await asyncio.sleep(self._settings.retry_interval)
            for port_id in list(self.failed):
                raw = self._desired.get(port_id)
                if raw is not None:
                    await self._bind(port_id, raw)

    async def _apply(self, batch: WatchBatch) -> None:
        for event in batch.events:
            parsed = keys.parse_node_port_key(event.key)
            if parsed is None or parsed[0] != self._settings.host:
                # Only the forwarder writes here, but a key no port id can make is skipped,
                # never turned into a state key of another shape.
                log.warning("agent.port.bad_key", key=event.key[:300])
                continue
            port_id = parsed[1]
            if event.kind == "put":
                self._desired[port_id] = event.value
                self.removed.pop(port_id, None)
                await self._bind(port_id, event.value)
            else:
                self._desired.pop(port_id, None)
                await self._unbind(port_id)

    # -- binding -------------------------------------------------------------------------

    async def _bind(self, port_id: str, raw: bytes) -> None:
        try:
            port = parse_desired_port(raw, port_id)
            plan = plumbing.plan_network(
                port,
                self._settings.vtep_ip,
                self._settings.physnet_mappings,
                self._settings.vlan_capable,
            )
            await self._ensure_plan(plan)
            if self.devices is not None and self.devices.handles(port):
                self.devices.bound(port, plan.bridge)  # reported wired once its device is there
            else:
                await self._etcd.put(
                    keys.state_port(self._settings.host, port_id),
                    values.port_state_value(time.time(), port),
                )
        except PodwireError as exc:
            log.warning("agent.port.not_wired", port=port_id, error=str(exc))
            self._metrics.bind_failures.inc()
            await self._set(port_id, None, str(exc))
            if self.devices is not None:
                self.devices.unbound(port_id)
            return
        log.info("agent.port.wired", port=port_id, network=port.network_id, bridge=plan.bridge)
        self._metrics.ports_wired.inc()
        await self._set(port_id, port, None)
        await self._reclaim(plan, port.mac_address)

    async def _ensure_plan(self, plan: NetworkPlan) -> None:
        if self._plans.get(plan.network_id) == plan:
            return
        async with self._kernel:
            if self._nl is not None:
                flood, remote = self._view.flood, self._remote_macs(plan.network_id)
                await self._nl.run(plumbing.ensure_network, plan, flood, remote)
                if plan.uplink and plan.network_type == "vxlan":
                    self._synced[plan.uplink] = (flood, remote)
            self._plans[plan.network_id] = plan
            self._tell_remote()

    async def _unbind(self, port_id: str) -> None:
        port = self.wired.get(port_id)
        # First: if etcd fails here nothing has changed yet, so the replayed delete redoes it all.
        await self._etcd.delete(keys.state_port(self._settings.host, port_id))
        self.removed[port_id] = None
        if len(self.removed) > REMEMBER_REMOVED:
            del self.removed[next(iter(self.removed))]
        await self._set(port_id, None, None)
        if self.devices is not None:
            self.devices.unbound(port_id)
        log.info("agent.port.unwired", port=port_id)
        if port is not None and not self._network_in_use(port.network_id):
            await self._remove_network(port.network_id)

    def _network_in_use(self, network_id: str) -> bool:
        return any(p.network_id == network_id for p in self.wired.values())

    async def _remove_network(self, network_id: str) -> None:
        plan = self._plans.get(network_id)
        if plan is None:
            return
        async with self._kernel:
            removed = (
                True if self._nl is None else await self._nl.run(plumbing.remove_network, plan)
            )
            if removed:
                self._plans.pop(network_id, None)
                self._synced.pop(plan.uplink or "", None)
                self._tell_remote()
        log.info("agent.network.removed" if removed else "agent.network.kept", bridge=plan.bridge)

    async def _reconcile_leftovers(self) -> None:
        """After a (re-)list: drop state keys and plumbing of ports that went away meanwhile."""
        await self._drop_state_except(set(self._desired))
        if self._nl is None:
            return
        keep = {plan.bridge for plan in self._plans.values()}
        async with self._kernel:
            sweep = await self._nl.run(plumbing.sweep_unused, keep)
        if sweep.removed:
            log.info("agent.network.swept", bridges=sweep.removed)
        if sweep.foreign:
            log.info("agent.network.foreign_left_alone", bridges=sweep.foreign, mark=naming.MARK)

    async def _drop_state_except(self, desired: set[str]) -> int:
        """Delete this host's wired-state keys of ports not in ``desired``."""
        prefix = keys.state_ports_prefix(self._settings.host)
        items, _ = await self._etcd.get_prefix(prefix)
        stale = [kv.key for kv in items if kv.key[len(prefix) :] not in desired]
        for key in stale:
            await self._etcd.delete(key)
        return len(stale)

    async def drop_stale_state(self) -> int:
        """On the way out: ports whose desired key went while the agent was stopping (its
        watch has ended) lose their wired state too, read from etcd now, so nothing reports
        a port wired that no agent serves."""
        listed, _ = await self._etcd.get_prefix(keys.node_ports_prefix(self._settings.host))
        desired = {parsed[1] for kv in listed if (parsed := keys.parse_node_port_key(kv.key))}
        return await self._drop_state_except(desired)

    async def _set(self, port_id: str, port: DesiredPort | None, error: str | None) -> None:
        async with self._changed:
            if port is None:
                self.wired.pop(port_id, None)
            else:
                self.wired[port_id] = port
                for listener in self.port_listeners:
                    listener(port_id, port)
            if error is None:
                self.failed.pop(port_id, None)
            else:
                self.failed[port_id] = error
            self._changed.notify_all()

    # -- peers and waiting ---------------------------------------------------------------

    async def set_peers(self, view: PeerView) -> None:
        """The other nodes changed (called by the peer tracker): each VXLAN network's flood
        list and remote MACs follow, changed only where they differ."""
        async with self._kernel:
            self._view, self._view_known = view, True
            for plan in list(self._plans.values()):
                if plan.network_type == "vxlan" and plan.uplink:
                    await self._sync_peers(plan)
            self._tell_remote()

    async def _sync_peers(self, plan: NetworkPlan) -> None:
        """Only the difference from what this device was last given; a device not synced
        before is read back from the kernel and made exact."""
        device = plan.uplink or ""
        wanted = (self._view.flood, self._remote_macs(plan.network_id))
        before = self._synced.get(device)
        if self._nl is None or before == wanted:
            return
        try:
            if before is None:
                await self._nl.run(plumbing.sync_peers, device, plan.bridge, *wanted)
            else:
                await self._nl.run(plumbing.update_peers, device, plan.bridge, before, wanted)
        except PodwireError as exc:  # one network's failure must not stop others
            log.warning("agent.peers.sync_failed", device=device, error=str(exc))
            self._synced.pop(device, None)  # read back in full next time
            return
        self._synced[device] = wanted

    async def _repair_peers(self) -> None:
        """What someone changed behind the agent (an FDB or neighbour entry deleted, a flood
        entry added) is read back and put right, counted and logged, as Felix does."""
        if self._nl is None:
            return
        while True:
            await asyncio.sleep(self._settings.repair_interval)
            async with self._kernel:
                for plan in list(self._plans.values()):
                    synced = self._synced.get(plan.uplink or "")
                    if plan.uplink and synced is not None:
                        await self._repair(plan.uplink, plan.bridge, synced)

    async def _repair(
        self, device: str, bridge: str, synced: tuple[set[str], dict[str, RemoteMac]]
    ) -> None:
        assert self._nl is not None
        try:
            changed = await self._nl.run(plumbing.sync_peers, device, bridge, *synced)
        except PodwireError as exc:
            log.warning("agent.peers.repair_failed", device=device, error=str(exc))
            return
        if changed:
            self._metrics.peer_repairs.inc(changed)
            log.warning("agent.peers.repaired", device=device, entries=changed)

    def _remote_macs(self, network_id: str) -> dict[str, RemoteMac]:
        local = {p.mac_address.lower() for p in self.wired.values() if p.network_id == network_id}
        return remote_macs(self._view, network_id, local)

    async def _reclaim(self, plan: NetworkPlan, mac: str) -> None:
        """A port wired here whose MAC another node claimed first: that claim leaves the
        network's VXLAN device now, not at the next change of the other nodes."""
        synced = self._synced.get(plan.uplink or "")
        if synced is None or mac.lower() not in {m.lower() for m in synced[1]}:
            return
        async with self._kernel:
            await self._sync_peers(plan)
            self._tell_remote()

    def _tell_remote(self) -> None:
        if self.on_remote is None or not self._view_known:
            return  # unchecked until the other nodes' ports are known: never dropped meanwhile
        self.on_remote({
            plan.uplink: frozenset(self._remote_macs(plan.network_id))
            for plan in self._plans.values()
            if plan.network_type == "vxlan" and plan.uplink
        })  # fmt: skip

    async def wait_wired(
        self, port_id: str, within: float, security_groups: list[str] | None = None
    ) -> DesiredPort:
        """The wired port, once it is; PortNotWired after ``within`` seconds. With
        ``security_groups``, once its desired value carries exactly those: a pooled port the
        controller moved to other groups is enforced with the new ones, never the old.
        PortVanished at once when the port's desired key was deleted (before or while
        waiting): the ADD asks for another port instead of waiting for this one."""
        wanted = None if security_groups is None else set(security_groups)

        def ready() -> bool:
            if port_id in self.failed or port_id in self.removed:
                return True
            port = self.wired.get(port_id)
            return port is not None and (wanted is None or set(port.security_groups) == wanted)

        async with self._changed:
            try:
                async with asyncio.timeout(within):
                    await self._changed.wait_for(ready)
            except TimeoutError as exc:
                if not ready():  # it may have come while the time-out took the lock back
                    raise self._not_wired(port_id, within, wanted) from exc
            # Removed first: unbinding deletes the state key and marks the port removed before
            # it leaves ``wired``, and an ADD waking in between must not wire a deleted port.
            if port_id not in self.removed and port_id in self.wired:
                return self.wired[port_id]
            if port_id in self.removed:
                raise PortVanished(
                    f"port {port_id} was deleted or unbound in Neutron before it was wired on"
                    f" host {self._settings.host}"
                )
            raise PortNotWiredPermanent(f"port {port_id} cannot be wired: {self.failed[port_id]}")

    def _not_wired(self, port_id: str, within: float, wanted: set[str] | None) -> PortNotWired:
        host = self._settings.host
        if port_id in self.wired and wanted is not None:
            return PortNotWired(
                f"port {port_id} still has security groups"
                f" {sorted(self.wired[port_id].security_groups)} on host {host}, not"
                f" {sorted(wanted)}, after {within:.0f} s"
            )
        return PortNotWired(
            f"port {port_id} is not wired on host {host} after {within:.0f} s: its binding"
            " has not reached etcd (is the ml2 forwarder running?)"
        )

    def plan_for(self, network_id: str) -> NetworkPlan | None:
        return self._plans.get(network_id)


def remote_macs(
    view: PeerView, network_id: str, local: frozenset[str] | set[str] = frozenset()
) -> dict[str, RemoteMac]:
    """The other nodes' ports of a network by MAC. The view holds only ports Neutron bound
    to their node, so two claims of one MAC are one port moving between nodes: the first
    claim keeps it (ties in time go by node name, then port id, the same on every node) until
    it goes. A MAC of a port wired here (``local``, lower case) is no other node's, whatever
    it claims: pointed at that node, this node's frames for its own pod would leave through
    the VXLAN device."""
    claims = sorted(
        (state.wired_at, host, port_id, state.mac, state.ips)
        for host, ports in view.ports.items()
        for port_id, state in ports.items()
        if state.network_id == network_id and state.mac
    )
    found: dict[str, RemoteMac] = {}
    for _, host, _, mac, ips in claims:
        assert mac is not None
        if mac.lower() in local:
            log.warning("agent.peers.local_mac_claimed", mac=mac, host=host)
            continue
        if mac in found:
            log.warning("agent.peers.mac_claimed_twice", mac=mac, host=host)
            continue
        found[mac] = RemoteMac(mac, view.vteps[host], frozenset(ips))
    return found
