"""The other nodes, from ``/podwire/state/nodes/``: which are alive, their VTEPs, their ports.

VXLAN flood entries follow hosts as they come and go; a host floods only while its heartbeat
key (bound to its lease) exists and its beat is fresh, so a dead host drops out when its lease
expires, or when it stops beating while someone else keeps its lease alive. The ports a
host reports wired become this node's forwarding and ARP/ND answers for them (Neutron's
l2population model, ``binder.remote_macs``), whether or not its agent runs now: the ports stay
wired in that host's kernel while its agent restarts.

Any node can write its own values, so none is taken on its word. A VTEP must be a unicast host
address of this node's own VTEP family, not loopback or link-local, not this node's own. A
port claim counts only for a port Neutron bound to that host: the ml2 forwarder's desired key
``/podwire/nodes/<host>/ports/<id>`` (written by no node) must exist, and the claim must not
contradict it; the MAC, network and addresses then come from Neutron's binding, never from the
claim. So a node can only announce ports that are its own. What is refused is logged once per
key and reason and counted (``podwire_agent_peer_values_rejected{kind}``); at most
``MAX_CLAIMS_PER_HOST`` claims of one node are held, so a flood costs its writer, not us.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from podwire import keys
from podwire.agent.metrics import AgentMetrics
from podwire.errors import ValidationError
from podwire.etcd import EtcdClient, PrefixWatcher, WatchEvent
from podwire.health import Health
from podwire.log import get_logger
from podwire.schema import nodes as values
from podwire.schema.nodes import PortState
from podwire.schema.ports import parse_desired_port

log = get_logger(__name__)

BEAT_CHECK = 1.0  # seconds between looks at the heartbeats' age (and at waiting claims)
UNBOUND = "no port of that id is bound to that host in Neutron"
PENDING_GRACE = 2.0  # seconds a claim may wait for its binding before it counts as refused
MAX_CLAIMS_PER_HOST = 4096  # far above what one node runs; past it a node's claims are refused
LOG_BUDGET = 20  # refusals logged per node and minute; all of them are counted


@dataclass(frozen=True)
class PeerView:
    """What this node knows of the others that have a VTEP; ``ports`` holds only claims of
    ports Neutron bound to that host, with Neutron's MAC, network and addresses."""

    vteps: dict[str, str] = field(default_factory=dict)  # host -> VTEP
    alive: frozenset[str] = frozenset()
    ports: dict[str, dict[str, PortState]] = field(default_factory=dict)  # host -> port id ->

    @property
    def flood(self) -> set[str]:
        return {vtep for host, vtep in self.vteps.items() if host in self.alive}


PeersChanged = Callable[[PeerView], Awaitable[None]]


@dataclass(frozen=True)
class BoundPort:
    """A port as Neutron bound it to a host (from the forwarder's desired key)."""

    network_id: str
    mac: str  # lower case
    ips: frozenset[str]


class LogBudget:
    """At most ``lines`` log lines per ``window`` seconds for each node; the lines it held
    back are counted and told in the next one."""

    def __init__(self, lines: int, window: float) -> None:
        self._lines, self._window = lines, window
        self._spent: dict[str, tuple[float, int]] = {}  # node -> (window start, lines)
        self._held: dict[str, int] = {}

    def allow(self, node: str) -> bool:
        now = time.monotonic()
        start, spent = self._spent.get(node, (now, 0))
        if now - start >= self._window:
            start, spent = now, 0
        if spent >= self._lines:
            self._held[node] = self._held.get(node, 0) + 1
            return False
        self._spent[node] = (start, spent + 1)
        return True

    def take_suppressed(self, node: str) -> int:
        return self._held.pop(node, 0)


@dataclass(frozen=True)
class Claim:
    state: PortState
    revision: int  # etcd's, when it was written


def check_claim(claim: PortState, bound: BoundPort | None) -> str | None:
    """Why a node's claim of a port is refused, or None when Neutron's binding backs it."""
    if bound is None:
        return UNBOUND
    if claim.network_id is not None and claim.network_id != bound.network_id:
        return f"network {claim.network_id} is not the port's network {bound.network_id}"
    if claim.mac is not None and claim.mac.lower() != bound.mac:
        return f"MAC {claim.mac} is not the port's MAC {bound.mac}"
    extra = sorted(set(claim.ips) - bound.ips)
    if extra:
        return f"addresses {extra} are not the port's fixed IPs"
    return None


class PeerTracker:
    def __init__(
        self,
        etcd: EtcdClient,
        host: str,
        on_change: PeersChanged,
        vtep_ip: str = "",
        metrics: AgentMetrics | None = None,
    ) -> None:
        self._host = host
        self._own = ipaddress.ip_address(vtep_ip) if vtep_ip else None
        self._on_change = on_change
        self._metrics = metrics or AgentMetrics()
        self._alive: set[str] = set()
        self._beats: dict[str, values.Alive] = {}
        self._vteps: dict[str, str] = {}
        self._bindings: dict[str, dict[str, BoundPort]] = {}  # host -> port id -> Neutron's
        self._claims: dict[str, dict[str, Claim]] = {}  # host -> port id -> its word
        # Claims waiting for their binding: (host, port id) -> (revision, since when).
        self._pending: dict[tuple[str, str], tuple[int, float]] = {}
        self._unbound_at: dict[tuple[str, str], int] = {}  # claims whose binding went
        self._accepted: dict[str, dict[str, PortState]] = {}  # the claims Neutron backs
        self._refused: dict[tuple[str, str], str] = {}  # (host, key) -> reason last logged
        self._log_budget = LogBudget(LOG_BUDGET, 60.0)
        self._listed: set[str] = set()
        self._dirty = True
        self._publishing = asyncio.Lock()
        self.view: PeerView | None = None  # None until both first listings are in
        self.watcher = PrefixWatcher(etcd, keys.state_prefix() + "nodes/")
        self.bindings = PrefixWatcher(etcd, keys.nodes_prefix())

    @property
    def healths(self) -> list[Health]:
        return [self.watcher.health, self.bindings.health]

    def replay(self) -> None:
        """After a failure half-way through a batch: both follows re-list."""
        self.watcher.replay()
        self.bindings.replay()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._follow("state", self.watcher, self._apply))
            tg.create_task(self._follow("bindings", self.bindings, self._apply_binding))
            tg.create_task(self._watch_beats())

    async def _follow(
        self, name: str, watcher: PrefixWatcher, apply: Callable[[WatchEvent], None]
    ) -> None:
        async for batch in watcher.batches():  # a re-list brings deletes of what went
            for event in batch.events:
                apply(event)
            self._listed.add(name)
            if watcher is self.bindings:  # only the bindings moving can settle a waiting claim
                self._settle_pending()
            if len(self._listed) == 2:
                await self._publish()

    # -- the nodes' own values -------------------------------------------------------------

    def _apply(self, event: WatchEvent) -> None:
        parsed = keys.parse_state_key(event.key)
        if parsed is None or parsed[0] == self._host:
            return
        host, kind, name = parsed
        if kind == "alive":
            self._beats.pop(host, None)
            if event.kind == "put":
                try:
                    self._beats[host] = values.parse_alive(event.value, f"alive of {host}")
                    self._accept(host, "alive")
                except ValidationError as exc:
                    self._refuse(host, "alive", "alive", str(exc))
            self._check_beats()
        elif kind == "vtep":
            self._apply_vtep(host, event)
        elif kind == "ports" and name:
            self._apply_claim(host, name, event)

    def _check_beats(self) -> None:
        """Alive: a heartbeat key whose beat is fresh (a lease anyone can keep alive does not
        keep a dead node in the flood lists)."""
        now = time.time()
        alive = {host for host, beat in self._beats.items() if beat.fresh(now)}
        if alive != self._alive:
            for host in sorted((self._alive - alive) & self._beats.keys()):
                log.warning(
                    "agent.peer.heartbeat_stale", host=host, beat_at=self._beats[host].beat_at
                )
            self._alive, self._dirty = alive, True

    async def _watch_beats(self) -> None:
        while True:
            await asyncio.sleep(BEAT_CHECK)
            if len(self._listed) == 2:
                self._check_beats()
                self._settle_pending()
                await self._publish()

    def _apply_vtep(self, host: str, event: WatchEvent) -> None:
        before = self._vteps.get(host)
        self._vteps.pop(host, None)
        if event.kind == "put":
            try:
                vtep = values.parse_vtep(event.value, f"vtep of {host}")
                self._vteps[host] = self._check_vtep(vtep)
                self._accept(host, "vtep")
            except ValidationError as exc:
                self._refuse(host, "vtep", "vtep", str(exc))
        self._dirty |= before != self._vteps.get(host)

    def _check_vtep(self, vtep: str) -> str:
        if self._own is None:
            return vtep
        address = ipaddress.ip_address(vtep)
        if address.version != self._own.version:
            raise ValidationError(f"{vtep} is not IPv{self._own.version} like this node's VTEP")
        if address == self._own:
            raise ValidationError(f"{vtep} is this node's own VTEP")
        return vtep

    def _apply_claim(self, host: str, port_id: str, event: WatchEvent) -> None:
        claims = self._claims.setdefault(host, {})
        claims.pop(port_id, None)
        if event.kind == "put":
            try:
                claim = values.parse_port_state(event.value, f"port {port_id} of {host}")
            except ValidationError as exc:
                self._refuse(host, f"ports/{port_id}", "port_state", str(exc))
            else:
                if len(claims) < MAX_CLAIMS_PER_HOST:
                    claims[port_id] = Claim(claim, event.mod_revision)
                else:
                    self._refuse(host, "ports/", "over_limit",
                                 f"more than {MAX_CLAIMS_PER_HOST} port claims")  # fmt: skip
        else:
            self._refused.pop((host, f"ports/{port_id}"), None)
            self._unbound_at.pop((host, port_id), None)
        if not claims:
            self._claims.pop(host, None)
        self._recheck(host, port_id)

    # -- Neutron's bindings ------------------------------------------------------------------

    def _apply_binding(self, event: WatchEvent) -> None:
        parsed = keys.parse_node_port_key(event.key)
        if parsed is None or parsed[0] == self._host:
            return
        host, port_id = parsed
        bindings = self._bindings.setdefault(host, {})
        was_bound = bindings.pop(port_id, None) is not None
        self._unbound_at.pop((host, port_id), None)
        if event.kind == "delete" and was_bound and port_id in self._claims.get(host, {}):
            self._unbound_at[(host, port_id)] = event.mod_revision  # its node unwires it next
        if event.kind == "put":
            try:
                port = parse_desired_port(event.value, port_id)
            except ValidationError as exc:  # the forwarder's own value: not expected
                log.warning("agent.peer.bad_binding", host=host, port=port_id, error=str(exc))
            else:
                ips = frozenset(ip.ip_address for ip in port.fixed_ips)
                bindings[port_id] = BoundPort(port.network_id, port.mac_address.lower(), ips)
        if not bindings:
            self._bindings.pop(host, None)
        self._recheck(host, port_id)

    # -- what counts ---------------------------------------------------------------------

    def _recheck(self, host: str, port_id: str) -> None:
        """One port of one host again: only what changed is looked at. A claim whose binding
        is not known yet waits (the forwarder's key is written first, but the two watches
        are separate streams); it is refused once the bindings are seen at its revision."""
        claim = self._claims.get(host, {}).get(port_id)
        bound = self._bindings.get(host, {}).get(port_id)
        accepted = self._accepted.setdefault(host, {})
        before = accepted.pop(port_id, None)
        self._pending.pop((host, port_id), None)
        if claim is not None:
            reason = check_claim(claim.state, bound)
            if bound is not None and reason is None:
                ips = tuple(sorted(bound.ips))
                state = PortState(claim.state.wired_at, bound.network_id, bound.mac, ips)
                accepted[port_id] = state
                self._accept(host, f"ports/{port_id}")
            elif bound is None and claim.revision < self._unbound_at.get((host, port_id), 0):
                pass  # written while bound: stale, not a lie; its node deletes it next
            elif bound is not None or claim.revision <= self.bindings.revision:
                self._refuse(host, f"ports/{port_id}", "claim", reason or "")
            else:
                self._pending[(host, port_id)] = (claim.revision, time.monotonic())
        if not accepted:
            self._accepted.pop(host, None)
        self._dirty |= before != accepted.get(port_id)

    def _settle_pending(self) -> None:
        """Claims the bindings have now caught up with and still find unbound, and claims
        whose binding has not come within ``PENDING_GRACE`` (in a quiet cluster the bindings
        watch may not move for minutes): refused. A binding that comes later still makes
        the claim count."""
        seen, old = self.bindings.revision, time.monotonic() - PENDING_GRACE
        for key, (revision, since) in list(self._pending.items()):
            if revision <= seen:
                self._recheck(*key)
            elif since <= old:
                del self._pending[key]
                self._refuse(key[0], f"ports/{key[1]}", "claim", UNBOUND)

    def _refuse(self, host: str, key: str, kind: str, reason: str) -> None:
        """Counted once per key and reason (a node repeating itself is not a log flood), and
        logged at most ``LOG_BUDGET`` times a minute per node; the rest is summed up in its
        next line."""
        if self._refused.get((host, key)) == reason:
            return
        self._refused[(host, key)] = reason
        self._metrics.peer_values_rejected.labels(kind).inc()
        if self._log_budget.allow(host):
            held = self._log_budget.take_suppressed(host)
            extra = {"not_logged": held} if held else {}
            log.warning(
                "agent.peer.value_refused", host=host, key=key, kind=kind, reason=reason, **extra
            )

    def _accept(self, host: str, key: str) -> None:
        self._refused.pop((host, key), None)

    async def _publish(self) -> None:
        async with self._publishing:
            if not self._dirty and self.view is not None:
                return
            self._dirty = False
            vteps = dict(self._vteps)
            ports = {h: dict(p) for h, p in self._accepted.items() if h in vteps}
            view = PeerView(vteps, frozenset(self._alive & vteps.keys()), ports)
            if view == self.view:
                return
            if self.view is None or view.flood != self.view.flood:
                log.info("agent.peers", peers=sorted(view.flood))
            self.view = view
            await self._on_change(view)
