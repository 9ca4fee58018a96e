"""The agent's security-group enforcement: policy from etcd + this node's ports -> nftables.

One task follows ``/podwire/global/`` (list, then watch from the revision; the watcher re-lists
after a compaction); another compiles and applies. A change is compiled whole (pure, fast,
cached per policy and per port), or, when only ports came or went, the last ruleset gets just
their elements; either is applied as the difference to what is in the kernel, in one
transaction; changes that arrive while one is applied are folded into the next. The first
application after a start replaces podwire's tables in one transaction, so a restarted agent
never leaves a window: the old tables enforce until the new ones do, and conntrack keeps the
flows it had. Nothing is removed on exit: the tables keep enforcing while the agent is down.

A CNI ADD calls ``enforce`` while it plugs the pod (the veth's host end comes up only after)
and answers only once the port's rules are in the kernel. A set of groups keeps its chains for
``keep_seconds`` after its last port left, so the next pod of it adds elements only.

Some ports' frames may also cross the node without the kernel (memif ports on the master's
shared path): for those the same pass compiles the second rendering of the policy, a
classifier, and hands it to ``filters``; a generation is in force once the kernel has its
rules *and* the master confirmed its classifiers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Protocol

from podwire import keys
from podwire.agent import naming
from podwire.agent.metrics import AgentMetrics
from podwire.backoff import Backoff, retry_forever
from podwire.errors import PodwireError, RetryableError
from podwire.etcd import EtcdClient, PrefixWatcher
from podwire.log import get_logger
from podwire.netfilter import Nftables, NftError
from podwire.schema import nodes as values
from podwire.schema.ports import DesiredPort
from podwire.sgpolicy import readback, ruleset
from podwire.sgpolicy.classifier import ClassifierTooLarge, compile_classifier, encode
from podwire.sgpolicy.compile import (
    Compiled,
    GroupSet,
    PortPolicy,
    compile_ruleset,
    group_set,
    policy_sets,
    secured_ports,
    with_ports,
)
from podwire.sgpolicy.marks import MAX_POLICY_ID
from podwire.sgpolicy.store import PolicyStore

log = get_logger(__name__)


class PolicyNotApplied(RetryableError):
    """The port's rules could not be put in force (yet); the ADD is retried by the runtime."""


@dataclass(frozen=True)
class EnforcerSettings:
    host: str
    # How long an ADD waits for a port's security groups to be published before it goes on
    # with what is known (missing groups allow nothing).
    group_wait: float = 5.0
    publish_interval: float = 1.0
    # Seconds a set of groups keeps its chains after its last port on the node left: a deleted
    # pod's replacement (the same deployment) then costs a few set elements, not new chains.
    keep_seconds: float = 60.0
    # Seconds between read-backs of podwire's tables (a change made behind the agent is
    # repaired within about this).
    repair_interval: float = 1.0


async def apply_change(nft: Nftables, change: ruleset.Change) -> None:
    """A pod's ADD or DEL, and most rule changes, change set elements only: those are packed
    and sent without nft text (``Nftables.apply_elements``)."""
    if change.elements_only:
        await nft.apply_elements(change.elements)
    elif text := change.text():
        await nft.apply(text)


class MasterFilters(Protocol):
    """Where a port's classifier goes when its frames can bypass the kernel (the memif
    master's shared path)."""

    def filtered_here(self, ifname: str) -> bool:
        """Whether ``ifname``'s frames may take a path the kernel does not filter."""
        ...

    async def install(self, ifname: str, blob: bytes | None, why: str) -> None:
        """Return once ``blob`` is in force for ``ifname`` wherever its frames bypass the
        kernel; ``None`` (with ``why``): it cannot be, keep its frames in the kernel."""
        ...


@dataclass
class _Entry:
    port: DesiredPort
    ifname: str


class PolicyEnforcer:
    def __init__(
        self,
        etcd: EtcdClient,
        nft: Nftables,
        settings: EnforcerSettings,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self._etcd = etcd
        self._nft = nft
        self._settings = settings
        self._metrics = metrics or AgentMetrics()
        self.store = PolicyStore()
        self.watcher = PrefixWatcher(etcd, keys.global_prefix())
        self._ports: dict[str, _Entry] = {}
        self._kept: dict[tuple[str, ...], float] = {}  # group set -> when its last port left
        self._policy_ids: dict[GroupSet, int] = {}  # as the last compilation gave them
        self._remote: dict[str, frozenset[str]] | None = None  # MACs other nodes may send
        self._applied: ruleset.Ruleset | None = None
        self._baseline: str | None = None  # readback fingerprint of the tables as applied
        self._applied_ports: dict[str, PortPolicy] = {}  # the ports ``_applied`` was made for
        self._applied_problems: list[str] = []
        self._policy_epoch = 0  # counts changes of groups, members, address groups
        self._applied_epoch = -1
        self._wanted = 0  # generation asked for
        self._done = 0  # generation in the kernel
        self._failure: str | None = None
        self._failed = 0  # generation that failed last
        self._seen_revision = 0
        self.revision = 0  # the etcd revision of /podwire/global/ in force
        self.enforced = 0
        self._problems: set[str] = set()
        self.filters: MasterFilters | None = None
        self._classified: dict[str, tuple[DesiredPort, int]] = {}  # ifname -> installed for
        self._dirty = asyncio.Event()
        # Notified when the groups known or the policy in force change: ADDs wait on it here,
        # and a test or benchmark can wait on it for ``revision`` from outside.
        self.changed = asyncio.Condition()
        self._listed = asyncio.Event()
        self._adopted = asyncio.Event()
        self.synced = asyncio.Event()

    # -- running -------------------------------------------------------------------------

    async def run(self) -> None:
        follow = retry_forever("policy", self._follow, Backoff(0.2, 2.0), self.watcher.health)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(follow)
            tg.create_task(self._apply_loop())
            tg.create_task(self._publish_loop())

    async def _follow(self) -> None:
        async with contextlib.aclosing(self.watcher.batches()) as batches:
            async for batch in batches:
                changed = [self.store.apply(event) for event in batch.events]
                self._seen_revision = batch.revision
                if any(changed):
                    self._policy_epoch += 1
                if any(changed) or not self._listed.is_set():
                    self._request()
                self._listed.set()
                async with self.changed:
                    self.changed.notify_all()  # ADDs waiting for a group

    def adopt(self, ports: list[tuple[DesiredPort, str]]) -> None:
        """The ports already plugged when the agent starts (from its checkpoint); the first
        application waits for this, so running pods keep their rules across a restart."""
        for port, ifname in ports:
            self._put(port, ifname)
        self._adopted.set()
        self._request()

    # -- ports ---------------------------------------------------------------------------

    async def enforce(self, port: DesiredPort, ifname: str, within: float) -> None:
        """Return once the rules of ``port``'s security groups are in force for ``ifname``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        await self._wait_groups(port, min(self._settings.group_wait, within))
        self._put(port, ifname)
        generation = self._request()
        async with self.changed:
            try:
                async with asyncio.timeout_at(deadline):
                    await self.changed.wait_for(lambda: max(self._done, self._failed) >= generation)
            except TimeoutError as exc:
                raise PolicyNotApplied(
                    f"security groups of port {port.port_id} not in force after {within:.0f} s"
                ) from exc
            if self._done < generation:
                raise PolicyNotApplied(f"security groups of port {port.port_id}: {self._failure}")

    async def _wait_groups(self, port: DesiredPort, within: float) -> None:
        def known() -> bool:
            return self._listed.is_set() and all(
                sg in self.store.groups for sg in port.security_groups
            )

        async with self.changed:
            try:
                async with asyncio.timeout(within):
                    await self.changed.wait_for(known)
            except TimeoutError:
                missing = sorted(set(port.security_groups) - set(self.store.groups))
                log.warning(
                    "agent.policy.groups_missing",
                    port=port.port_id,
                    groups=missing,
                    effect="enforced without them: what they would allow is dropped",
                )

    def port_changed(self, port_id: str, port: DesiredPort) -> None:
        """The desired value of a port changed (new security groups, pairs, port security)."""
        entry = self._ports.get(port_id)
        if entry is not None and entry.port != port:
            entry.port = port
            self._request()

    def remote_changed(self, macs: dict[str, frozenset[str]] | None) -> None:
        """The other nodes' ports changed: what each VXLAN device may receive from."""
        if macs != self._remote:
            self._remote = macs
            self._policy_epoch += 1  # recompiled whole; applied as a difference all the same
            self._request()

    def forget(self, port_id: str) -> None:
        entry = self._ports.pop(port_id, None)
        if entry is not None:
            self._classified.pop(entry.ifname, None)
            self._kept[group_set(entry.port)] = time.monotonic()
            self._request()

    def _kept_sets(self, now: float) -> list[tuple[str, ...]]:
        """The group sets whose chains stay; expired ones are dropped (the next apply
        removes their chains)."""
        keep = self._settings.keep_seconds
        for sgs in [s for s, left in self._kept.items() if now - left >= keep]:
            del self._kept[sgs]
        return sorted(self._kept)

    def _next_expiry(self) -> float | None:
        if not self._kept:
            return None
        return min(self._kept.values()) + self._settings.keep_seconds

    def _put(self, port: DesiredPort, ifname: str) -> None:
        entry = self._ports.get(port.port_id)
        if entry is not None:
            entry.port, entry.ifname = port, ifname
            return
        if group_set(port) not in self._policy_ids and len(self._policy_ids) >= MAX_POLICY_ID:
            raise PolicyNotApplied(f"more than {MAX_POLICY_ID} sets of security groups here")
        self._ports[port.port_id] = _Entry(port, ifname)

    def _request(self) -> int:
        self._wanted += 1
        self._dirty.set()
        return self._wanted

    # -- applying ------------------------------------------------------------------------

    async def _apply_loop(self) -> None:
        await self._listed.wait()
        await self._adopted.wait()
        while True:
            if not await self._dirty_or_expiry():
                await self._read_back()
                continue
            self._dirty.clear()
            generation, revision = self._wanted, self._seen_revision
            try:
                await self._apply_once()
            except PodwireError as exc:
                self._failure, self._failed = str(exc), generation
                log.error("agent.policy.apply_failed", error=str(exc))
                self._metrics.policy_applies.labels("failed").inc()
                async with self.changed:
                    self.changed.notify_all()
                await asyncio.sleep(1.0)
                self._dirty.set()
                continue
            self._failure = None
            self.revision = revision
            async with self.changed:
                self._done = generation
                self.changed.notify_all()
            self.synced.set()
            if not self._dirty.is_set():  # off the ADD's path: it was answered above
                await self._take_baseline()

    async def _dirty_or_expiry(self) -> bool:
        """Until a change is asked for or a kept group set expires (True), or it is time to
        read the tables back (False)."""
        expiry = self._next_expiry()
        check = time.monotonic() + self._settings.repair_interval
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # arrives as the event is set, and this loop would then never end.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, min(check, expiry or check) - time.monotonic())):
                await self._dirty.wait()
        return self._dirty.is_set() or (expiry is not None and time.monotonic() >= expiry)

    async def _take_baseline(self) -> None:
        """The tables as this agent left them, to compare later listings with. Taken when
        nothing else waits to be applied; a change someone made in between becomes part of
        it until podwire's next change of its own."""
        try:
            self._baseline = await readback.fingerprint(self._nft)
        except PodwireError as exc:
            self._baseline = None
            log.warning("agent.policy.readback_failed", error=str(exc)[:500])

    async def _read_back(self) -> None:
        """Someone changed podwire's tables (flushed, deleted, added to): all of it again."""
        if self._baseline is None or self._applied is None:
            if self._applied is not None:
                await self._take_baseline()
            return
        try:
            found = await readback.fingerprint(self._nft)
        except PodwireError as exc:
            log.warning("agent.policy.readback_failed", error=str(exc)[:500])
            return
        if found != self._baseline:
            log.warning("agent.policy.repaired", effect="podwire's tables replaced whole")
            self._metrics.policy_repairs.inc()
            self._applied, self._baseline = None, None
            self._request()

    def _port_policies(self) -> list[PortPolicy]:
        return [PortPolicy(e.port, e.ifname) for _, e in sorted(self._ports.items())]

    def _kept_now(self, ports: list[PortPolicy]) -> list[GroupSet]:
        in_use = {group_set(p.port) for p in ports}
        return [s for s in self._kept_sets(time.monotonic()) if s not in in_use]

    def _compile(self) -> tuple[Compiled, dict[str, PortPolicy]]:
        """Ports plugged, changed or removed and nothing else (a pod's ADD or DEL): the last
        ruleset with their elements; otherwise everything compiled again. With the ports it
        was made for."""
        ports = self._port_policies()
        by_id = {p.port.port_id: p for p in ports}
        kept = self._kept_now(ports)
        compiled = self._ports_only(ports, by_id, kept)
        if compiled is None:
            inputs = self.store.inputs()
            inputs.ports, inputs.kept, inputs.policy_ids = ports, kept, self._policy_ids
            inputs.remote_macs = self._remote
            compiled = compile_ruleset(inputs, naming.DEVICES)
        return compiled, by_id

    def _ports_only(
        self, ports: list[PortPolicy], by_id: dict[str, PortPolicy], kept: list[GroupSet]
    ) -> Compiled | None:
        """None unless the policies stay as they are and every port that comes or goes has
        all its groups published (so the problems stay as they are, too)."""
        if self._applied is None or self._policy_epoch != self._applied_epoch:
            return None
        if policy_sets(ports, kept) != self._policy_ids.keys():
            return None
        before = self._applied_ports
        gone = [p for key, p in before.items() if by_id.get(key) != p]
        added = [p for key, p in by_id.items() if before.get(key) != p]
        gone, added = secured_ports(gone), secured_ports(added)
        if any(sg not in self.store.groups for p in gone + added for sg in p.port.security_groups):
            return None
        ids = self._policy_ids
        changed = with_ports(
            self._applied,
            [(p, ids[group_set(p.port)]) for p in gone],
            [(p, ids[group_set(p.port)]) for p in added],
        )
        return Compiled(changed, self._applied_problems, len(secured_ports(ports)), ids)

    async def _apply_once(self) -> None:
        started = time.perf_counter()
        epoch = self._policy_epoch
        compiled, ports = self._compile()
        self._report(compiled.problems)
        change = None if self._applied is None else ruleset.change(self._applied, compiled.ruleset)
        if change is None:
            await self._nft.apply(ruleset.replace(compiled.ruleset))
            kind = "replace"
        else:
            kind = "change"
            try:
                await apply_change(self._nft, change)
            except NftError as exc:
                # The kernel is not what we think (someone edited our tables): start over.
                log.warning("agent.policy.change_refused", error=str(exc)[:500])
                await self._nft.apply(ruleset.replace(compiled.ruleset))
                kind = "replace"
        self._applied = compiled.ruleset
        self._applied_ports, self._applied_problems = ports, compiled.problems
        self._applied_epoch = epoch
        self._policy_ids = compiled.policy_ids
        await self._install_classifiers(epoch)
        self.enforced = compiled.enforced
        seconds = time.perf_counter() - started
        self._metrics.policy_applies.labels(kind).inc()
        self._metrics.policy_seconds.observe(seconds)
        self._metrics.policy_ports.set(compiled.enforced)
        log.debug("agent.policy.applied", kind=kind, ports=compiled.enforced, seconds=seconds)

    async def _install_classifiers(self, epoch: int) -> None:
        """Each bypassing port whose port value or policy changed since its last one: its
        classifier compiled from the same inputs as the ruleset, installed and confirmed."""
        if self.filters is None:
            return
        inputs = self.store.inputs()
        for entry in [e for _, e in sorted(self._ports.items())]:
            if not self.filters.filtered_here(entry.ifname):
                continue
            wanted = (entry.port, epoch)
            if self._classified.get(entry.ifname) == wanted:
                continue
            try:
                blob: bytes | None = encode(compile_classifier(inputs, entry.port))
                why = "security groups in the master" if entry.port.filtered else "unfiltered"
            except ClassifierTooLarge as exc:
                blob, why = None, str(exc)
            await self.filters.install(entry.ifname, blob, why)
            self._classified[entry.ifname] = wanted

    def _report(self, problems: list[str]) -> None:
        """Log each problem once, when it appears (a change re-compiles everything)."""
        current = set(problems)
        for key, found in self.store.problems.items():
            current.update(f"{key}: {p}" for p in found)
        for problem in sorted(current - self._problems):
            log.warning("agent.policy.problem", problem=problem)
        self._metrics.policy_problems.set(len(current))
        self._problems = current

    # -- publishing ----------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        """What ``podwire status`` shows per node; at most once per interval, never in the
        way of an application."""
        published: tuple[int, int, int] | None = None
        key = keys.state_policy(self._settings.host)
        while True:
            await self.synced.wait()
            now = (self.enforced, self.revision, len(self._problems))
            if now != published:
                value = values.policy_state_value(
                    self.enforced, self.revision, len(self._problems), time.time()
                )
                try:
                    await self._etcd.put(key, value)
                    published = now
                except PodwireError as exc:
                    log.warning("agent.policy.publish_failed", error=str(exc))
            await asyncio.sleep(self._settings.publish_interval)
