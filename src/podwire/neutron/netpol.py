"""The Neutron calls of the NetworkPolicy reconciler: security groups, their rules and
address groups of one project, read and changed as plain values.

podwire's mark is a tag on each group (Neutron tags security groups) and, on address groups,
which take no tags here, a name prefix with a description of podwire's: the reconciler is
only ever shown, and so only ever deletes, objects that carry it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from podwire.neutron.client import _translated

ADDRESS_GROUP_MARK = "podwire NetworkPolicy: "


@dataclass(frozen=True)
class ObservedRule:
    id: str
    direction: str
    ethertype: str
    protocol: str | None
    port_min: int | None
    port_max: int | None
    remote_ip_prefix: str | None
    remote_address_group_id: str | None
    remote_group_id: str | None


@dataclass(frozen=True)
class ObservedGroup:
    id: str
    name: str
    rules: tuple[ObservedRule, ...]


@dataclass(frozen=True)
class ObservedAddressGroup:
    id: str
    name: str
    addresses: frozenset[str]


@dataclass(frozen=True)
class RuleBody:
    direction: str
    ethertype: str
    protocol: str | None
    port_min: int | None
    port_max: int | None
    remote_ip_prefix: str | None
    remote_address_group_id: str | None


class NetpolObjects:
    """One project's marked groups and address groups, through an openstacksdk connection."""

    def __init__(self, conn: Any, project_id: str, tag: str, name_prefix: str) -> None:
        self._conn = conn
        self._project = project_id
        self._tag = tag
        self._prefix = name_prefix

    @property
    def _net(self) -> Any:
        return self._conn.network

    @_translated("list security groups")
    def groups(self) -> list[ObservedGroup]:
        found = self._net.security_groups(project_id=self._project, tags=self._tag)
        return [_group(raw) for raw in found if str(raw.name).startswith(self._prefix)]

    @_translated("list address groups")
    def address_groups(self) -> list[ObservedAddressGroup]:
        return [
            ObservedAddressGroup(raw.id, raw.name, frozenset(raw.addresses or ()))
            for raw in self._net.address_groups(project_id=self._project)
            if str(raw.name).startswith(self._prefix)
            and str(raw.description or "").startswith(ADDRESS_GROUP_MARK)
        ]

    @_translated("create security group")
    def create_group(self, name: str, description: str) -> ObservedGroup:
        raw = self._net.create_security_group(
            name=name, description=description, project_id=self._project
        )
        try:
            self._net.set_tags(raw, [self._tag])
        except BaseException:  # an untagged group would be nobody's: removed, then raised
            self._net.delete_security_group(raw.id, ignore_missing=True)
            raise
        return _group(raw)

    @_translated("delete security group")
    def delete_group(self, group_id: str) -> None:
        self._net.delete_security_group(group_id, ignore_missing=True)

    @_translated("create security group rules")
    def create_rules(self, group_id: str, rules: Iterable[RuleBody]) -> None:
        """A group's rules in one request (Neutron's bulk create takes one group at a time):
        a policy made costs a call, not one per port and address family."""
        bodies = [_rule_body(group_id, rule) for rule in rules]
        if bodies:
            list(self._net.create_security_group_rules(bodies))

    @_translated("delete security group rule")
    def delete_rule(self, rule_id: str) -> None:
        self._net.delete_security_group_rule(rule_id, ignore_missing=True)

    @_translated("create address group")
    def create_address_group(self, name: str, description: str, addresses: Iterable[str]) -> str:
        raw = self._net.create_address_group(
            name=name,
            description=ADDRESS_GROUP_MARK + description,
            addresses=sorted(addresses),
            project_id=self._project,
        )
        return str(raw.id)

    @_translated("update address group")
    def change_addresses(self, group_id: str, add: Iterable[str], remove: Iterable[str]) -> None:
        added, removed = sorted(add), sorted(remove)
        if added:
            self._net.add_addresses_to_address_group(group_id, added)
        if removed:
            self._net.remove_addresses_from_address_group(group_id, removed)

    @_translated("delete address group")
    def delete_address_group(self, group_id: str) -> None:
        self._net.delete_address_group(group_id, ignore_missing=True)


def _rule_body(group_id: str, rule: RuleBody) -> dict[str, Any]:
    body = {
        "security_group_id": group_id,
        "direction": rule.direction,
        "ethertype": rule.ethertype,
        "protocol": rule.protocol,
        "port_range_min": rule.port_min,
        "port_range_max": rule.port_max,
        "remote_ip_prefix": rule.remote_ip_prefix,
        "remote_address_group_id": rule.remote_address_group_id,
    }
    return {key: value for key, value in body.items() if value is not None}


def _group(raw: Any) -> ObservedGroup:
    rules = tuple(_rule(rule) for rule in raw.security_group_rules or ())
    return ObservedGroup(str(raw.id), str(raw.name), rules)


def _rule(raw: dict[str, Any]) -> ObservedRule:
    return ObservedRule(
        id=str(raw["id"]),
        direction=str(raw["direction"]),
        ethertype=str(raw["ethertype"]),
        protocol=raw.get("protocol"),
        port_min=raw.get("port_range_min"),
        port_max=raw.get("port_range_max"),
        remote_ip_prefix=raw.get("remote_ip_prefix"),
        remote_address_group_id=raw.get("remote_address_group_id"),
        remote_group_id=raw.get("remote_group_id"),
    )
