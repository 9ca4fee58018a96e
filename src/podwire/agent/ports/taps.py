"""Ports of vif type ``tap``: a VM's NIC or a Neutron agent's device, made by someone else.

For such a port the ml2 driver tells Nova (or the DHCP/L3 agent) to make a device named
``tap`` + the port id's first 11 characters; QEMU/libvirt or podwire's interface driver makes
it, whenever it likes, and may remove it and make it again (a VM stopped and started). The
agent learns of it from the kernel's link events (no polling), and *adopts* it: the port's
rules are put in force for that name first, then the device gets the network's MTU, joins the
network's bridge and comes up, and only then is the port reported wired (Neutron: ACTIVE).
When the device disappears the port is reported unwired (DOWN); when it comes back it is
adopted again. The device stays its maker's: the agent never deletes it and, when the port
leaves this host, only takes it out of the bridge it put it in. A tap-named device of no port
bound here is left alone.

Work per port is serialised (one worker task at a time per port, re-run while changes keep
arriving), so a device that comes and goes during an adoption ends in the state the last
event describes. After an agent restart the first link dump finds the adopted devices still
on their bridges; they are adopted again, which changes nothing in the kernel, so their
traffic goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from dataclasses import dataclass

from podwire import keys
from podwire.agent.metrics import AgentMetrics
from podwire.agent.ports.attach import Attacher, Gate, gate_open
from podwire.backoff import Backoff, retry_forever
from podwire.errors import PodwireError, RetryableError
from podwire.etcd import EtcdClient
from podwire.health import Health
from podwire.log import get_logger
from podwire.netlink import (
    DumpDone,
    HostNetlink,
    LinkEvent,
    LinkGone,
    LinkInfo,
    LinkResync,
    Netlink,
    link_events,
    open_link_events,
)
from podwire.schema import nodes as values
from podwire.schema.ports import DesiredPort, is_tap_name, tap_name

log = get_logger(__name__)

ADOPT_TIMEOUT = 30.0  # for the port's rules to be in force
RETRY = Backoff(0.2, 5.0)


@dataclass(frozen=True)
class _Wanted:
    port: DesiredPort
    bridge: str


@dataclass(frozen=True)
class _Adopted:
    """What the agent changed on a device: the bridge it put it in, at this index and MTU."""

    index: int
    bridge: str
    mtu: int


class TapGone(RetryableError):
    """The device went away while it was being adopted; its next appearance is adopted."""


def _adopt_link(nl: Netlink, index: int, name: str, bridge: str, mtu: int) -> None:
    """MTU and bridge in one request, then up; refused if ``index`` is no longer ``name``."""
    found = nl.link(name)
    if found is None or found.index != index:
        raise TapGone(f"{name} (index {index}) is gone")
    nl.set_link(index, mtu=mtu, master=nl.require_index(bridge))
    if not found.up:
        nl.set_up(index)


def _release_link(nl: Netlink, name: str, adopted: _Adopted) -> bool:
    """Out of the bridge the agent put it in (only that: the rest is its maker's)."""
    found = nl.link(name)
    bridge = nl.link_index(adopted.bridge)
    if found is None or found.index != adopted.index or not bridge or found.master != bridge:
        return False
    nl.set_link(found.index, master=0)
    return True


class TapPorts:
    """Adopts the devices of this host's tap ports (the binder's ``PortDevices``)."""

    def __init__(
        self,
        etcd: EtcdClient,
        host: str,
        host_nl: HostNetlink,
        attacher: Attacher,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self._etcd = etcd
        self._host = host
        self._nl = host_nl
        self._attacher = attacher
        self._metrics = metrics or AgentMetrics()
        self._wanted: dict[str, _Wanted] = {}  # port id -> desired value and bridge
        self._by_name: dict[str, str] = {}  # tap name -> port id
        self._links: dict[str, LinkInfo] = {}  # tap-named links present on the host
        self._seen_at: dict[str, float] = {}  # tap name -> when it last appeared
        self._unconfirmed: set[str] | None = None  # during a re-dump: not listed again yet
        self._adopted: dict[str, _Adopted] = {}
        self._dirty: set[str] = set()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        self.listed = asyncio.Event()  # the first link dump is in
        self.health = Health("taps")

    # -- the binder's side ---------------------------------------------------------------

    def handles(self, port: DesiredPort) -> bool:
        return port.vif_type == "tap"

    def bound(self, port: DesiredPort, bridge: str) -> None:
        """The port is desired here and its network's bridge exists."""
        name = tap_name(port.port_id)
        self._wanted[port.port_id] = _Wanted(port, bridge)
        self._by_name[name] = port.port_id
        self._kick(port.port_id)

    def unbound(self, port_id: str) -> None:
        if self._wanted.pop(port_id, None) is not None:
            self._by_name.pop(tap_name(port_id), None)
            self._kick(port_id)

    def plugged(self) -> list[tuple[DesiredPort, str]]:
        """Desired ports whose device is there now (after ``listed``): the rules a restarted
        agent's first application must already hold."""
        return [
            (wanted.port, tap_name(port_id))
            for port_id, wanted in self._wanted.items()
            if tap_name(port_id) in self._links
        ]

    # -- running -------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            for port_id in list(self._dirty):
                self._start_worker(port_id)
            try:
                await retry_forever("taps", self._follow, Backoff(0.2, 2.0), self.health)
            finally:
                self._group = None

    async def _follow(self) -> None:
        try:
            sock = await self._nl.run(open_link_events)
        except OSError as exc:
            raise RetryableError(f"opening link events: {exc}") from exc
        self._unconfirmed = set(self._links)
        try:
            async with contextlib.aclosing(link_events(sock)) as events:
                async for event in events:
                    self._on_event(event)
        except OSError as exc:
            raise RetryableError(f"reading link events: {exc}") from exc

    def _on_event(self, event: LinkEvent) -> None:
        if isinstance(event, LinkResync):
            log.warning("agent.tap.events_lost", action="listing every link again")
            self._unconfirmed = set(self._links)
        elif isinstance(event, DumpDone):
            for name in self._unconfirmed or ():
                self._link_gone(name)
            self._unconfirmed = None
            self.health.ok()
            self.listed.set()
        elif isinstance(event, LinkGone):
            if is_tap_name(event.name):
                self._link_gone(event.name)
        elif is_tap_name(event.name):
            self._link_seen(event)

    def _link_seen(self, link: LinkInfo) -> None:
        if self._unconfirmed is not None:
            self._unconfirmed.discard(link.name)
        before = self._links.get(link.name)
        self._links[link.name] = link
        if before is None or before.index != link.index:
            self._seen_at[link.name] = time.monotonic()
        port_id = self._by_name.get(link.name)
        if port_id is not None:
            self._kick(port_id)

    def _link_gone(self, name: str) -> None:
        if self._links.pop(name, None) is None:
            return
        port_id = self._by_name.get(name)
        if port_id is not None:
            self._kick(port_id)

    # -- one worker per port -------------------------------------------------------------

    def _kick(self, port_id: str) -> None:
        self._dirty.add(port_id)
        if port_id not in self._workers and self._group is not None:
            self._start_worker(port_id)

    def _start_worker(self, port_id: str) -> None:
        assert self._group is not None
        self._workers[port_id] = self._group.create_task(self._work(port_id))

    async def _work(self, port_id: str) -> None:
        try:
            await self.listed.wait()
            attempt = 0
            while port_id in self._dirty:
                self._dirty.discard(port_id)
                try:
                    await self._reconcile(port_id)
                    attempt = 0
                except PodwireError as exc:  # one port's trouble never stops the others
                    if not self._vanished(exc):
                        log.warning("agent.tap.retrying", port=port_id, error=str(exc))
                        self._metrics.tap_adoptions.labels("retry").inc()
                        await asyncio.sleep(RETRY.delay(attempt))
                        attempt += 1
                        self._dirty.add(port_id)
        finally:
            self._workers.pop(port_id, None)

    def _vanished(self, exc: PodwireError) -> bool:
        """A device deleted under the adoption: its link event re-runs the port anyway."""
        gone = isinstance(exc, TapGone) or getattr(exc, "code", 0) == errno.ENODEV
        if gone:
            log.info("agent.tap.gone_during_adoption", error=str(exc))
        return gone

    async def _reconcile(self, port_id: str) -> None:
        name = tap_name(port_id)
        wanted, link = self._wanted.get(port_id), self._links.get(name)
        if wanted is None:
            await self._release(port_id, name)
        elif link is None:
            await self._absent(port_id, name)
        elif self._adopted.get(port_id) != _Adopted(link.index, wanted.bridge, wanted.port.mtu):
            await self._adopt(wanted, link)

    async def _adopt(self, wanted: _Wanted, link: LinkInfo) -> None:
        port = wanted.port
        deadline = asyncio.get_running_loop().time() + ADOPT_TIMEOUT

        async def plug(gate: Gate | None) -> None:
            await gate_open(gate)  # the device joins the bridge only with its rules in force
            await self._nl.run(_adopt_link, link.index, link.name, wanted.bridge, port.mtu)

        await self._attacher.attach(port, link.name, plug, deadline)
        await self._report_wired(port)
        self._adopted[port.port_id] = _Adopted(link.index, wanted.bridge, port.mtu)
        seen = self._seen_at.get(link.name)
        if seen is not None:
            self._metrics.tap_adopt_seconds.observe(time.monotonic() - seen)
        self._metrics.tap_adoptions.labels("adopted").inc()
        self._metrics.taps.set(len(self._adopted))
        log.info(
            "agent.tap.adopted",
            port=port.port_id,
            interface=link.name,
            bridge=wanted.bridge,
            owner=port.device_owner,
        )

    async def _absent(self, port_id: str, name: str) -> None:
        """No device (yet, or any more): the port is not wired here."""
        was = self._adopted.pop(port_id, None)
        await self._report_unwired(port_id)
        if was is not None:
            self._metrics.taps.set(len(self._adopted))
            log.info("agent.tap.gone", port=port_id, interface=name, effect="port DOWN")

    async def _release(self, port_id: str, name: str) -> None:
        """The port left this host: its device leaves our bridge, its rules go."""
        adopted = self._adopted.pop(port_id, None)
        if adopted is not None:
            released = await self._nl.run(_release_link, name, adopted)
            log.info("agent.tap.released", port=port_id, interface=name, from_bridge=released)
        self._attacher.forget(port_id)
        await self._report_unwired(port_id)
        self._metrics.taps.set(len(self._adopted))

    async def _report_wired(self, port: DesiredPort) -> None:
        key = keys.state_port(self._host, port.port_id)
        await self._etcd.put(key, values.port_state_value(time.time(), port))

    async def _report_unwired(self, port_id: str) -> None:
        """Also for a port never reported by this run: a restarted agent's stale key goes."""
        await self._etcd.delete(keys.state_port(self._host, port_id))
