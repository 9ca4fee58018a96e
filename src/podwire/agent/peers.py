"""The other nodes, from ``/podwire/state/nodes/``: which are alive, their VTEPs, their ports.

VXLAN flood entries follow hosts as they come and go; a host floods only while its heartbeat
key (bound to its lease) exists, so a dead host drops out when its lease expires. The ports a
host reports wired (with network, MAC and IPs) become this node's forwarding and ARP/ND
answers for them, in place of learning from frames (``binder.remote_macs``), whether or not
its agent runs now: the ports stay wired in that host's kernel while its agent restarts, and
their traffic must not stop meanwhile (a host's own agent removes what it no longer serves).
Any node can write its own values, so each one is read strictly: a VTEP must be a unicast
host address of this node's own VTEP family (the kernel refuses the other family on a VXLAN
device), not loopback or link-local, not this node's own; a bad value is logged and left out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from podwire import keys
from podwire.errors import ValidationError
from podwire.etcd import EtcdClient, PrefixWatcher, WatchEvent
from podwire.log import get_logger
from podwire.schema import nodes as values
from podwire.schema.nodes import PortState

log = get_logger(__name__)


@dataclass(frozen=True)
class PeerView:
    """What this node knows of the others that have a VTEP."""

    vteps: dict[str, str] = field(default_factory=dict)  # host -> VTEP
    alive: frozenset[str] = frozenset()
    ports: dict[str, dict[str, PortState]] = field(default_factory=dict)  # host -> port id ->

    @property
    def flood(self) -> set[str]:
        return {vtep for host, vtep in self.vteps.items() if host in self.alive}

    def legacy(self) -> list[str]:
        """Hosts reporting ports without their MAC (agents from before l2population)."""
        return sorted(
            h for h, ports in self.ports.items() if any(not p.mac for p in ports.values())
        )


PeersChanged = Callable[[PeerView], Awaitable[None]]


class PeerTracker:
    def __init__(
        self, etcd: EtcdClient, host: str, on_change: PeersChanged, vtep_ip: str = ""
    ) -> None:
        self._etcd = etcd
        self._host = host
        self._own = ipaddress.ip_address(vtep_ip) if vtep_ip else None
        self._on_change = on_change
        self._alive: set[str] = set()
        self._vteps: dict[str, str] = {}
        self._ports: dict[str, dict[str, PortState]] = {}
        self.view: PeerView | None = None  # None until the first listing is in
        self.watcher = PrefixWatcher(etcd, keys.state_prefix() + "nodes/")

    async def run(self) -> None:
        async for batch in self.watcher.batches():  # a re-list brings deletes of what went
            for event in batch.events:
                self._apply(event)
            await self._publish()

    def _apply(self, event: WatchEvent) -> None:
        parsed = keys.parse_state_key(event.key)
        if parsed is None or parsed[0] == self._host:
            return
        host, kind, name = parsed
        if kind == "alive":
            if event.kind == "put":
                self._alive.add(host)
            else:
                self._alive.discard(host)
        elif kind == "vtep":
            self._apply_vtep(host, event)
        elif kind == "ports" and name:
            self._apply_port(host, name, event)

    def _apply_vtep(self, host: str, event: WatchEvent) -> None:
        if event.kind == "delete":
            self._vteps.pop(host, None)
            return
        try:
            self._vteps[host] = self._check(values.parse_vtep(event.value, f"vtep of {host}"))
        except ValidationError as exc:
            log.warning("agent.peer.bad_vtep", host=host, error=str(exc))
            self._vteps.pop(host, None)

    def _apply_port(self, host: str, port_id: str, event: WatchEvent) -> None:
        ports = self._ports.setdefault(host, {})
        if event.kind == "delete":
            ports.pop(port_id, None)
            return
        try:
            ports[port_id] = values.parse_port_state(event.value, f"port {port_id} of {host}")
        except ValidationError as exc:
            log.warning("agent.peer.bad_port_state", host=host, port=port_id, error=str(exc))
            ports.pop(port_id, None)

    def _check(self, vtep: str) -> str:
        if self._own is None:
            return vtep
        address = ipaddress.ip_address(vtep)
        if address.version != self._own.version:
            raise ValidationError(f"{vtep} is not IPv{self._own.version} like this node's VTEP")
        if address == self._own:
            raise ValidationError(f"{vtep} is this node's own VTEP")
        return vtep

    async def _publish(self) -> None:
        vteps = dict(self._vteps)
        ports = {h: dict(p) for h, p in self._ports.items() if h in vteps and p}
        view = PeerView(vteps, frozenset(self._alive & vteps.keys()), ports)
        if view == self.view:
            return
        if self.view is None or view.flood != self.view.flood:
            log.info("agent.peers", peers=sorted(view.flood))
        self.view = view
        await self._on_change(view)
