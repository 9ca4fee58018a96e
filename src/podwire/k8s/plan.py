"""What to change in Neutron so that it holds a DesiredPolicy: the difference between the
compiled groups and the marked objects Neutron has, as a list of steps in an order Neutron
accepts (address groups before the rules that name them, rules gone before their groups and
address groups). Pure, so that convergence is tested without Neutron."""

from __future__ import annotations

from dataclasses import dataclass, field

from podwire.k8s.groups import DesiredAddressGroup, DesiredGroup, DesiredPolicy, SgRule
from podwire.neutron.netpol import ObservedAddressGroup, ObservedGroup, ObservedRule

ANY = ("0.0.0.0/0", "::/0")  # a prefix of a whole family is no remote, as the compiler writes it


@dataclass(frozen=True)
class AddressChange:
    group_id: str
    add: frozenset[str]
    remove: frozenset[str]


@dataclass
class Plan:
    create_address_groups: list[DesiredAddressGroup] = field(default_factory=list)
    change_addresses: list[AddressChange] = field(default_factory=list)
    create_groups: list[DesiredGroup] = field(default_factory=list)
    # Rules of groups that exist already; a created group gets its rules once it has an id.
    add_rules: list[tuple[str, SgRule]] = field(default_factory=list)
    delete_rules: list[str] = field(default_factory=list)
    delete_groups: list[str] = field(default_factory=list)
    delete_address_groups: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not any(
            (
                self.create_address_groups,
                self.change_addresses,
                self.create_groups,
                self.add_rules,
                self.delete_rules,
                self.delete_groups,
                self.delete_address_groups,
            )
        )


def plan(
    desired: DesiredPolicy,
    groups: list[ObservedGroup],
    address_groups: list[ObservedAddressGroup],
) -> Plan:
    steps = Plan()
    names = _address_groups(steps, desired, address_groups)
    observed = {group.name: group for group in groups}
    for name, group in sorted(desired.groups.items()):
        current = observed.get(name)
        if current is None:
            steps.create_groups.append(group)
        else:
            _rules(steps, group, current, names)
    steps.delete_groups.extend(old.id for old in groups if old.name not in desired.groups)
    return steps


def _address_groups(
    steps: Plan, desired: DesiredPolicy, observed: list[ObservedAddressGroup]
) -> dict[str, str]:
    """Plans the address groups; returns the name of each existing one by its id."""
    by_name = {group.name: group for group in observed}
    for name, wanted in sorted(desired.address_groups.items()):
        current = by_name.get(name)
        if current is None:
            steps.create_address_groups.append(wanted)
        elif current.addresses != wanted.addresses:
            add, remove = wanted.addresses - current.addresses, current.addresses - wanted.addresses
            steps.change_addresses.append(AddressChange(current.id, add, remove))
    for group in observed:
        if group.name not in desired.address_groups:
            steps.delete_address_groups.append(group.id)
    return {group.id: group.name for group in observed}


def _rules(steps: Plan, group: DesiredGroup, current: ObservedGroup, names: dict[str, str]) -> None:
    add, delete = rule_changes(group, current, names)
    steps.delete_rules.extend(delete)
    steps.add_rules.extend((current.id, rule) for rule in add)


def rule_changes(
    group: DesiredGroup, current: ObservedGroup, names: dict[str, str]
) -> tuple[list[SgRule], list[str]]:
    """The rules to add and the ids of those to delete; also for a group just created, whose
    default rules Neutron made (the open egress group keeps them)."""
    have: dict[SgRule, str] = {}
    delete: list[str] = []
    for rule in current.rules:
        value = as_desired(rule, names)
        if value is None or value in have:
            delete.append(rule.id)  # a rule podwire would never write, or a twin
        else:
            have[value] = rule.id
    delete.extend(rule_id for value, rule_id in have.items() if value not in group.rules)
    add = sorted(group.rules - have.keys(), key=lambda rule: rule.order)
    return add, delete


def as_desired(rule: ObservedRule, names: dict[str, str]) -> SgRule | None:
    """Neutron's rule in the compiler's terms, or None if it names a remote group or an
    address group that is not podwire's."""
    if rule.remote_group_id is not None:
        return None
    remote_group = None
    if rule.remote_address_group_id is not None:
        remote_group = names.get(rule.remote_address_group_id)
        if remote_group is None:
            return None
    return SgRule(
        rule.direction,
        rule.ethertype,
        rule.protocol,
        rule.port_min,
        rule.port_max,
        None if rule.remote_ip_prefix in ANY else rule.remote_ip_prefix,
        remote_group,
    )
