"""Neutron's security-group rows turned into the values agents enforce (``schema.secgroups``).

Pure functions: the driver feeds them rows read inside Neutron's transaction, the resync feeds
them the same rows read from the whole database, so both publish byte-identical values and a
resync after a clean run changes nothing.

Normalising happens here, at the source, wherever Neutron's value is unambiguous (protocol
names to numbers, host bits of allowed address pairs). A rule that the schema cannot express is
still published as Neutron stores it: the agent's reader then reports it and leaves it out,
which only ever denies more.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podwire import keys
from podwire.errors import ValidationError
from podwire.schema import doc
from podwire.schema.ports import AddressPair
from podwire.schema.secgroups import (
    MAX_ADDRESSES,
    AddressGroup,
    GroupMember,
    SecurityGroup,
    parse_rule,
)

RULE_FIELDS = (
    "id",
    "direction",
    "ethertype",
    "protocol",
    "port_range_min",
    "port_range_max",
    "remote_ip_prefix",
    "remote_group_id",
    "remote_address_group_id",
)


@dataclass(frozen=True)
class GroupRow:
    """One ``securitygroups`` row with its revision (from ``standardattributes``)."""

    sg_id: str
    project_id: str | None
    stateful: bool
    revision: int


def rule_value(row: Mapping[str, Any]) -> dict[str, Any]:
    """The published form of one Neutron rule row: normalised, or Neutron's own fields when
    the schema refuses it (the agent leaves such a rule out and says why)."""
    raw = {name: row.get(name) for name in RULE_FIELDS}
    if raw["protocol"] is not None and not isinstance(raw["protocol"], str | int):
        raw["protocol"] = str(raw["protocol"])
    prefix = raw["remote_ip_prefix"]
    if isinstance(prefix, str):
        # Neutron keeps the prefix as typed and matches its network (normalized_cidr).
        with contextlib.suppress(ValueError):
            raw["remote_ip_prefix"] = host_or_network(prefix)
    try:
        return parse_rule(raw, f"rule {raw['id']}").to_dict()
    except ValidationError:
        return raw


def group_value(group: GroupRow, rules: Iterable[Mapping[str, Any]]) -> str:
    """The ``/podwire/global/secgroups/<id>`` value; rules sorted by id, so equal groups give
    equal bytes whatever order the database returned them in."""
    values = sorted((rule_value(row) for row in rules), key=lambda rule: str(rule["id"]))
    body = SecurityGroup(
        sg_id=group.sg_id,
        rules=(),
        stateful=group.stateful,
        project_id=group.project_id,
        revision=group.revision,
    ).to_dict()
    body["rules"] = values
    return doc.encode(body).decode()


def host_or_network(value: str) -> str:
    """A fixed IP or an address pair's ip_address as a canonical CIDR; host bits are dropped
    the way ipset/nft sets would drop them."""
    return str(ipaddress.ip_network(value.strip(), strict=False))


def member_addresses(fixed_ips: Iterable[str], pair_ips: Iterable[str]) -> tuple[str, ...]:
    """What a member port gives its groups: fixed IPs and allowed-address-pair IPs (Neutron's
    remote-group semantics include both), sorted and without duplicates."""
    found: set[str] = set()
    for value in (*fixed_ips, *pair_ips):
        try:
            found.add(host_or_network(value))
        except ValueError:
            continue  # Neutron validated it; a row we cannot read gives nothing to admit
    ordered = sorted(found, key=_address_order)
    return tuple(ordered[:MAX_ADDRESSES])


def _address_order(cidr: str) -> tuple[int, int, int]:
    network = ipaddress.ip_network(cidr)
    return network.version, int(network.network_address), network.prefixlen


def member_value(port_id: str, addresses: Sequence[str]) -> str:
    return GroupMember(port_id, tuple(addresses)).encode()


def address_group_value(ag_id: str, addresses: Iterable[str]) -> str:
    found = {host_or_network(address) for address in addresses}
    ordered = tuple(sorted(found, key=_address_order)[:MAX_ADDRESSES])
    return AddressGroup(ag_id, ordered).encode()


def address_pairs(port: Mapping[str, Any]) -> tuple[AddressPair, ...]:
    """The port's allowed address pairs for its desired value (Neutron fills in the MAC)."""
    mac = str(port.get("mac_address") or "").lower()
    pairs = []
    for pair in port.get("allowed_address_pairs") or []:
        pair_mac = str(pair.get("mac_address") or mac).lower()
        pairs.append(AddressPair(host_or_network(str(pair["ip_address"])), pair_mac))
    return tuple(sorted(set(pairs), key=lambda p: (_address_order(p.ip_address), p.mac_address)))


@dataclass(frozen=True)
class Membership:
    """The member keys one port has: one per group, all with the same value."""

    port_id: str
    groups: frozenset[str]
    addresses: tuple[str, ...]

    def puts(self) -> dict[str, str]:
        value = member_value(self.port_id, self.addresses)
        return {keys.remote_group_member(sg, self.port_id): value for sg in sorted(self.groups)}


def port_membership(port: Mapping[str, Any] | None) -> Membership | None:
    """A port dict as ML2 passes it (``context.current`` / ``context.original``)."""
    if port is None:
        return None
    fixed = [str(ip["ip_address"]) for ip in port.get("fixed_ips") or []]
    pairs = [str(pair["ip_address"]) for pair in port.get("allowed_address_pairs") or []]
    return Membership(
        port_id=str(port["id"]),
        groups=frozenset(port.get("security_groups") or ()),
        addresses=member_addresses(fixed, pairs),
    )


def membership_changes(
    before: Membership | None, after: Membership | None
) -> list[tuple[str, str | None]]:
    """Journal rows taking the member keys from ``before`` to ``after``: deletes for groups
    the port left, puts for groups it joined or whose value changed, nothing otherwise."""
    old = before.puts() if before is not None else {}
    new = after.puts() if after is not None else {}
    changes: list[tuple[str, str | None]] = [(key, None) for key in old if key not in new]
    changes += [(key, value) for key, value in new.items() if old.get(key) != value]
    return changes
