"""The NetworkPolicy reconciler: makes one project's marked Neutron security groups and
address groups hold what the cluster's policies compile to.

It works from a snapshot each time (compile, read Neutron, plan, apply), so a missed event,
a restart or a failed call is repaired by the next pass: the only state is Neutron's and the
API's. Neutron's calls are blocking (openstacksdk) and run on a worker thread.

Reading Neutron is most of a pass's cost when a pod comes or goes (two lists for one
address-group update), so a pass that changed only addresses keeps what it read, with its
own changes applied, for the next pass (``Observed``). Anything else a pass changes, a
failed pass, a new term, or a reading older than ``OBSERVED_MAX_AGE`` reads Neutron again:
what someone changed by hand is repaired by the first pass after that."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol, TypeVar

from podwire.backoff import Backoff
from podwire.errors import PodwireError
from podwire.k8s.budget import OverBudget, within_budget
from podwire.k8s.compile import Cluster, compile_policies
from podwire.k8s.groups import SgRule
from podwire.k8s.objects import ObjectKey
from podwire.k8s.plan import Plan, plan, rule_changes
from podwire.kubeside.metrics import KubeMetrics
from podwire.kubeside.policy_view import PolicyView
from podwire.kubeside.refusals import PolicyRefused, policies_in, refused
from podwire.log import get_logger
from podwire.neutron.client import NeutronInUse
from podwire.neutron.netpol import NetpolObjects, ObservedAddressGroup, ObservedGroup, RuleBody

log = get_logger(__name__)

T = TypeVar("T")

OBSERVED_MAX_AGE = 60.0  # seconds a pass trusts an earlier pass's reading of Neutron


@dataclass(frozen=True)
class Observed:
    """The marked groups and address groups as a pass read (and then left) them."""

    groups: list[ObservedGroup]
    address_groups: list[ObservedAddressGroup]
    read_at: float

    def after(self, steps: Plan) -> Observed | None:
        """What Neutron holds after ``steps`` if they changed only addresses; None if they
        changed more (the next pass reads Neutron)."""
        if steps.create_address_groups or steps.create_groups or steps.add_rules:
            return None
        if steps.delete_rules or steps.delete_groups or steps.delete_address_groups:
            return None
        changes = {change.group_id: change for change in steps.change_addresses}
        kept = []
        for group in self.address_groups:
            change = changes.get(group.id)
            if change is not None:
                group = replace(group, addresses=(group.addresses | change.add) - change.remove)
            kept.append(group)
        return replace(self, address_groups=kept)


class PortSide(Protocol):
    """What follows a pass on the ports' side (``policy_ports.PolicyPorts``): in-use ports
    moved to their pods' groups, and pooled ports cleared of a group about to be deleted."""

    async def follow(self, view: PolicyView) -> int: ...
    async def clear_group(self, group_id: str) -> int: ...


class NetpolReconciler:
    def __init__(
        self,
        cluster: Callable[[], Cluster],
        objects: NetpolObjects,
        backoff: Backoff | None = None,
        fence: Callable[[str], None] | None = None,
        metrics: KubeMetrics | None = None,
        ports: PortSide | None = None,
    ) -> None:
        """``fence`` is called before every Neutron write with what it is about to do and
        refuses it by raising (the leader's term guard: a pass decided in a term that ended
        must not change what the next leader is already reconciling). ``ports``: moves the
        ports after each pass (None: the groups alone, as in tests of the reconciler)."""
        self._cluster = cluster
        self._objects = objects
        self._backoff = backoff or Backoff(0.5, 10.0)
        self._fence = fence or (lambda _what: None)
        self._metrics = metrics
        self._ports = ports
        # Groups of deleted policies Neutron would not delete yet (ports carry them): passes
        # come back for them after ``_linger``'s delays even if nothing else changes.
        self.lingering: frozenset[str] = frozenset()
        self._linger = Backoff(1.0, 30.0)
        self.problem: str | None = None  # the last pass's failure, until a pass succeeds
        # The marked groups' Neutron ids by name as the last successful pass left them: what
        # a pod's port may be given (a group not here yet is not in Neutron yet).
        self.group_ids: dict[str, str] = {}
        self._passed = asyncio.Event()  # set (and replaced) when a pass succeeds
        # Told the policies and Neutron's words when Neutron refuses a pass (their Events).
        self.on_refused: Callable[[list[ObjectKey], str], None] | None = None
        # Told once of each policy kept closed (over the size budget, or unreadable), with
        # why (its Event).
        self.on_not_enforced: Callable[[ObjectKey, str], None] | None = None
        self.not_enforced: dict[ObjectKey, str] = {}
        self._observed: Observed | None = None  # an earlier pass's reading, still true

    async def run(self, changed: asyncio.Event) -> None:
        """A pass after every change; a pass that failed is repeated after a backoff, a
        refused one too (a quota, a rule Neutron will not take): its cause may go away, and
        the reconciler must outlive it."""
        while True:
            await self._wait(changed)
            changed.clear()
            try:
                await self.sync()
                self._backoff.reset()
                self.problem = None
                self._count("ok")
                passed, self._passed = self._passed, asyncio.Event()
                passed.set()
            except PodwireError as exc:
                self.problem = str(exc)
                self._count("failed")
                if isinstance(exc, PolicyRefused):
                    # The rest of the pass was applied: a pod waiting for a group made by it
                    # may go on.
                    passed, self._passed = self._passed, asyncio.Event()
                    passed.set()
                    if self.on_refused is not None:
                        self.on_refused(exc.policies, str(exc))
                delay = self._backoff.next()
                log.warning("netpol.sync.retry", error=str(exc), delay=delay)
                await asyncio.sleep(delay)
                changed.set()

    async def _wait(self, changed: asyncio.Event) -> None:
        """Until a change, or until it is time to try the lingering groups again."""
        if not self.lingering:
            self._linger.reset()
            await changed.wait()
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._linger.next()):
                await changed.wait()

    async def next_pass(self) -> None:
        """Until the next pass has succeeded (one that starts after this call or is running)."""
        await self._passed.wait()

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.netpol_syncs.labels(result=result).inc()

    async def sync(self) -> Plan:
        """One pass; returns what it changed in the groups. The ports follow before any
        group is deleted, so a deleted policy's group is carried by no port of ours when
        Neutron is asked to delete it."""
        cluster = self._cluster()  # a snapshot taken on the loop, where the caches change
        observed, self._observed = self._observed, None  # trusted again once this pass is done
        if observed is not None and time.monotonic() - observed.read_at > OBSERVED_MAX_AGE:
            observed = None
        steps, view, read, over, refusal = await asyncio.to_thread(self._sync, cluster, observed)
        self._note_not_enforced(over, cluster)
        if self._ports is not None:
            await self._ports.follow(view)
            for group_id in steps.delete_groups:
                await self._ports.clear_group(group_id)
        group_ids = dict(view.group_ids)
        self.lingering = frozenset(await asyncio.to_thread(self._delete, steps, group_ids))
        self.group_ids = group_ids
        if refusal is not None:  # after the rest of the pass: it failed for these alone
            raise refusal
        self._observed = read.after(steps)
        return steps

    def _note_not_enforced(self, over: list[OverBudget], cluster: Cluster) -> None:
        """Policies kept closed, for their size or because podwire cannot read them: named
        when they become so (or why changes), not on every pass while they stay."""
        now = {found.policy: found.message() for found in over}
        for key, policy in cluster.policies.items():
            unreadable = policy.not_enforced()
            if unreadable is not None:
                now[key] = unreadable
        for key, why in now.items():
            if self.not_enforced.get(key) == why:
                continue
            log.warning("netpol.policy_not_enforced", policy=str(key), why=why)
            if self.on_not_enforced is not None:
                self.on_not_enforced(key, why)
        self.not_enforced = now

    def _read(self) -> Observed:
        address_groups = self._objects.address_groups()
        return Observed(self._objects.groups(), address_groups, time.monotonic())

    def _sync(
        self, cluster: Cluster, observed: Observed | None
    ) -> tuple[Plan, PolicyView, Observed, list[OverBudget], PolicyRefused | None]:
        """Raises what ends the pass; Neutron's refusals of some objects do not: the rest
        is applied and the refusal returned (the pass is repeated with backoff)."""
        desired, over = within_budget(compile_policies(cluster), cluster.policies)
        refusal = None
        observed = observed or self._read()
        steps = plan(desired, observed.groups, observed.address_groups)
        group_ids = {group.name: group.id for group in observed.groups}
        if not steps.empty:
            address_group_ids = {group.name: group.id for group in observed.address_groups}
            refusals = self._apply(steps, address_group_ids, group_ids)
            if refusals:
                policies = policies_in(desired, cluster.policies, refusals)
                refusal = PolicyRefused(next(iter(refusals.values())), policies)
            log.info("netpol.synced", **_counts(steps), refused=sorted(refusals))
        view = PolicyView(
            pods=cluster.pods,
            policies=desired.pods,
            group_ids=group_ids,
            marked=frozenset(group_ids.values()) | {group.id for group in observed.groups},
        )
        return steps, view, observed, over, refusal

    def _apply(
        self, steps: Plan, address_group_ids: dict[str, str], group_ids: dict[str, str]
    ) -> dict[str, str]:
        """All but the deletions (``_delete``, once the ports have followed); ``group_ids``
        (by name) gains the groups created. Returns what Neutron refused (the names of
        groups and address groups, with its words): one policy over a quota must not keep
        the others from being enforced, so the rest goes on without those objects (and
        without the rules naming an address group not made)."""
        refusals: dict[str, str] = {}
        self._address_groups(steps, address_group_ids, refusals)
        additions = list(steps.add_rules) + self._groups(steps, group_ids, refusals)
        self._rules(additions, address_group_ids, group_ids, refusals)
        for rule_id in steps.delete_rules:
            self._fence("Neutron delete_security_group_rule")
            self._objects.delete_rule(rule_id)
        return refusals

    def _address_groups(
        self, steps: Plan, address_group_ids: dict[str, str], refusals: dict[str, str]
    ) -> None:
        objects, fence = self._objects, self._fence
        for wanted in steps.create_address_groups:
            fence("Neutron create_address_group")
            call = partial(
                objects.create_address_group, wanted.name, wanted.description, wanted.addresses
            )
            made = _refusable(refusals, wanted.name, call)
            if made is not None:
                address_group_ids[wanted.name] = made
        names = {known: name for name, known in address_group_ids.items()}
        for change in steps.change_addresses:
            fence("Neutron update_address_group")
            moves = partial(objects.change_addresses, change.group_id, change.add, change.remove)
            _refusable(refusals, names.get(change.group_id, change.group_id), moves)

    def _groups(
        self, steps: Plan, group_ids: dict[str, str], refusals: dict[str, str]
    ) -> list[tuple[str, SgRule]]:
        """The groups to create; returns the rules they need."""
        objects, fence = self._objects, self._fence
        additions: list[tuple[str, SgRule]] = []
        for group in steps.create_groups:
            fence("Neutron create_security_group")
            call = partial(objects.create_group, group.name, group.description)
            created = _refusable(refusals, group.name, call)
            if created is None:
                continue
            group_ids[group.name] = created.id
            # Neutron's default rules (all egress) go first: a new group is never wider than
            # its policy, only narrower until its rules are in.
            add, delete = rule_changes(group, created, {})
            for rule_id in delete:
                fence("Neutron delete_security_group_rule")
                objects.delete_rule(rule_id)
            additions.extend((created.id, rule) for rule in add)
        return additions

    def _rules(
        self,
        additions: list[tuple[str, SgRule]],
        address_group_ids: dict[str, str],
        group_ids: dict[str, str],
        refusals: dict[str, str],
    ) -> None:
        """A group's rules in one request; none of a group whose address group was refused."""
        names = {known: name for name, known in group_ids.items()}
        by_group: dict[str, list[RuleBody]] = {}
        for group_id, rule in additions:
            remote = rule.remote_address_group
            if remote is not None and remote not in address_group_ids:
                refusals.setdefault(names[group_id], refusals[remote])
                continue
            by_group.setdefault(group_id, []).append(_body(rule, address_group_ids))
        for group_id, bodies in by_group.items():
            if names[group_id] in refusals:
                continue
            self._fence("Neutron create_security_group_rules")
            call = partial(self._objects.create_rules, group_id, bodies)
            _refusable(refusals, names[group_id], call)

    def _delete(self, steps: Plan, group_ids: dict[str, str]) -> list[str]:
        """The groups and address groups the plan deletes; ``group_ids`` (by name) follows.
        Returns the groups Neutron kept because ports still carry them."""
        objects, fence = self._objects, self._fence
        kept = []
        for group_id in steps.delete_groups:
            names = [name for name, known in group_ids.items() if known == group_id]
            fence("Neutron delete_security_group")
            try:
                objects.delete_group(group_id)
            except NeutronInUse:
                # Ports still carry it that are not ours to move (a pod the API no longer
                # has, a port recycling, someone else's): tried again by the next passes,
                # and the rest of this pass goes on.
                log.warning("netpol.group_in_use", group=group_id, names=names)
                kept.append(group_id)
                continue
            for name in names:
                del group_ids[name]
        for group_id in steps.delete_address_groups:
            fence("Neutron delete_address_group")
            try:
                objects.delete_address_group(group_id)
            except NeutronInUse:  # named by the rules of a group kept above: later
                log.warning("netpol.address_group_in_use", address_group=group_id)
        return kept


def _refusable(refusals: dict[str, str], name: str, call: Callable[[], T]) -> T | None:
    """``call``'s result, or None when Neutron refused it (noted under ``name``, the object
    it was writing); any other failure ends the pass."""
    try:
        return call()
    except PodwireError as exc:
        if not refused(exc):
            raise
        refusals.setdefault(name, str(exc))
        return None


def _body(rule: SgRule, address_group_ids: dict[str, str]) -> RuleBody:
    remote = rule.remote_address_group
    return RuleBody(
        direction=rule.direction,
        ethertype=rule.ethertype,
        protocol=rule.protocol,
        port_min=rule.port_min,
        port_max=rule.port_max,
        remote_ip_prefix=rule.remote_ip_prefix,
        remote_address_group_id=None if remote is None else address_group_ids[remote],
    )


def _counts(steps: Plan) -> dict[str, int]:
    return {
        "address_groups_created": len(steps.create_address_groups),
        "address_groups_changed": len(steps.change_addresses),
        "groups_created": len(steps.create_groups),
        "rules_added": len(steps.add_rules),
        "rules_deleted": len(steps.delete_rules),
        "groups_deleted": len(steps.delete_groups),
        "address_groups_deleted": len(steps.delete_address_groups),
    }
