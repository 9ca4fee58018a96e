"""A ceiling on the rules one NetworkPolicy may cost in Neutron.

The API takes policies whose Neutron form is enormous: an ipBlock of a whole family with a
few host ``except``s is up to 32 (IPv4) or 128 (IPv6) prefixes per except, each a rule per
port. Neutron would take them, slowly, and every agent would carry them; meanwhile the one
reconciler is busy with that group and every other policy waits, which is the very failure
(one rule per address, Neutron overloaded) these groups exist to avoid. So a policy over the
ceiling is refused instead: its group is kept with no rules, so the pods it selects stay
isolated in its directions and get only what the other policies allow (closed, never more
open than the policy asked), and the caller names it on the policy."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from podwire.k8s.groups import DesiredGroup, DesiredPolicy
from podwire.k8s.objects import ObjectKey

MAX_POLICY_RULES = 1000


@dataclass(frozen=True)
class OverBudget:
    policy: ObjectKey
    rules: int
    limit: int

    def message(self) -> str:
        return (
            f"this policy would be {self.rules} Neutron security-group rules, more than"
            f" podwire's limit of {self.limit} per policy (an ipBlock's excepts become the"
            " prefixes around them, each a rule per port); its pods are isolated as it says"
            " but allowed nothing by it: fewer excepts, ports or peers fix it"
        )


def within_budget(
    desired: DesiredPolicy, policies: Iterable[ObjectKey], limit: int = MAX_POLICY_RULES
) -> tuple[DesiredPolicy, list[OverBudget]]:
    """``desired`` with the groups of policies over ``limit`` emptied (and address groups
    no rule names any longer dropped), and those policies."""
    groups = dict(desired.groups)
    over = []
    for key in sorted(policies, key=str):
        own = _policy_groups(desired, key)
        rules = sum(len(group.rules) for group in own)
        if rules > limit:
            over.append(OverBudget(key, rules, limit))
            groups.update((group.name, replace(group, rules=frozenset())) for group in own)
    if not over:
        return desired, []
    named = {rule.remote_address_group for group in groups.values() for rule in group.rules}
    address_groups = {n: a for n, a in desired.address_groups.items() if n in named}
    return replace(desired, groups=groups, address_groups=address_groups), over


def _policy_groups(desired: DesiredPolicy, key: ObjectKey) -> list[DesiredGroup]:
    """The policy's group, and those of its named ports on ingress."""
    return [group for group in desired.groups.values() if group.policy == key]
