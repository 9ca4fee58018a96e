"""Security-group policy as the forwarder publishes it and agents enforce it.

Three values, all written only by the ml2 forwarder from Neutron's own rows in the
transaction of the change, and read by every agent (docs/architecture.md §3):

- ``/podwire/global/secgroups/<sg_id>``: one group and its rules (``SecurityGroup``);
- ``/podwire/global/remote_groups/<sg_id>/<port_id>``: the addresses one member port gives
  its groups, for rules naming the group as ``remote_group_id`` (``GroupMember``);
- ``/podwire/global/address_groups/<ag_id>``: one address group (``AddressGroup``).

Rules are normalised here once (protocol names to numbers, Neutron's ICMP "ports" to
type/code), so an agent never interprets Neutron's spellings itself. A group's rules are read
one by one: a rule that does not parse is reported and left out, the others are enforced.
Leaving a rule out only ever denies more — every rule is an allow — so bad input can never
open a port by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podwire.errors import ValidationError
from podwire.schema import doc, fields

INGRESS = "ingress"
EGRESS = "egress"
DIRECTIONS = (INGRESS, EGRESS)
ETHERTYPES = ("IPv4", "IPv6")
MAX_RULES = 1000
MAX_ADDRESSES = 256

# Neutron's accepted protocol names (neutron_lib.constants.IP_PROTOCOL_MAP) to IANA numbers;
# "ipv6-icmp" and "icmpv6" are Neutron's two spellings of 58, "any" and "" mean all.
PROTOCOL_NUMBERS = {
    "ah": 51,
    "dccp": 33,
    "egp": 8,
    "esp": 50,
    "gre": 47,
    "hopopt": 0,
    "icmp": 1,
    "icmpv6": 58,
    "igmp": 2,
    "ipip": 4,
    "ipv6-encap": 41,
    "ipv6-frag": 44,
    "ipv6-icmp": 58,
    "ipv6-nonxt": 59,
    "ipv6-opts": 60,
    "ipv6-route": 43,
    "ospf": 89,
    "pgm": 113,
    "rsvp": 46,
    "sctp": 132,
    "tcp": 6,
    "udp": 17,
    "udplite": 136,
    "vrrp": 112,
}
ICMP = 1
ICMPV6 = 58
# Protocols whose rules may carry a port range.
PORT_PROTOCOLS = frozenset({6, 17, 33, 132, 136})


@dataclass(frozen=True)
class Rule:
    """One allow rule, normalised.

    ``protocol`` None matches every protocol. For TCP/UDP/SCTP/DCCP/UDP-Lite ``port_min`` /
    ``port_max`` are the destination port range (None: all ports). For ICMP / ICMPv6 they are
    Neutron's reuse of the fields: ``port_min`` the type, ``port_max`` the code (None: any).
    At most one of ``remote_ip_prefix``, ``remote_group_id``, ``remote_address_group_id``.
    """

    rule_id: str
    direction: str
    ethertype: str
    protocol: int | None = None
    port_min: int | None = None
    port_max: int | None = None
    remote_ip_prefix: str | None = None
    remote_group_id: str | None = None
    remote_address_group_id: str | None = None

    @property
    def is_icmp(self) -> bool:
        return self.protocol in (ICMP, ICMPV6)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.rule_id,
            "direction": self.direction,
            "ethertype": self.ethertype,
            "protocol": self.protocol,
            "port_range_min": self.port_min,
            "port_range_max": self.port_max,
            "remote_ip_prefix": self.remote_ip_prefix,
            "remote_group_id": self.remote_group_id,
            "remote_address_group_id": self.remote_address_group_id,
        }


@dataclass(frozen=True)
class SecurityGroup:
    sg_id: str
    rules: tuple[Rule, ...]
    stateful: bool = True
    project_id: str | None = None
    # The Neutron revision of the group when it was forwarded, shown by ``podwire status``.
    revision: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": doc.SCHEMA_VERSION,
            "id": self.sg_id,
            "stateful": self.stateful,
            "project_id": self.project_id,
            "revision": self.revision,
            "rules": [rule.to_dict() for rule in self.rules],
        }

    def encode(self) -> str:
        return doc.encode(self.to_dict()).decode()


@dataclass(frozen=True)
class ParsedGroup:
    """A group as read: the rules that parsed, and one problem per rule left out."""

    group: SecurityGroup
    problems: tuple[str, ...]


@dataclass(frozen=True)
class GroupMember:
    """The addresses one port contributes to a remote group: its fixed IPs and the IPs of its
    allowed address pairs (Neutron's remote-group semantics include both)."""

    port_id: str
    addresses: tuple[str, ...]  # canonical CIDRs; a host address is /32 or /128

    def encode(self) -> str:
        body = {"port_id": self.port_id, "addresses": list(self.addresses)}
        return doc.encode_versioned(body).decode()


@dataclass(frozen=True)
class AddressGroup:
    ag_id: str
    addresses: tuple[str, ...]  # canonical CIDRs

    def encode(self) -> str:
        return doc.encode_versioned({"id": self.ag_id, "addresses": list(self.addresses)}).decode()


def parse_rule(value: Any, what: str) -> Rule:
    """One rule in the published (normalised) form; ValidationError names what is wrong."""
    obj = doc.Obj(doc.as_object(value, what), what)
    ethertype = obj.req("ethertype", lambda v, w: fields.one_of(v, w, ETHERTYPES))
    protocol = obj.maybe("protocol", protocol_number)
    if protocol == ICMP and ethertype == "IPv6":
        protocol = ICMPV6  # Neutron accepts "icmp" on IPv6 rules and means ICMPv6
    if protocol == ICMPV6 and ethertype == "IPv4":
        raise ValidationError(f"{what}: ICMPv6 in an IPv4 rule")
    port_min = obj.maybe("port_range_min", _port_field)
    port_max = obj.maybe("port_range_max", _port_field)
    _check_ports(what, protocol, port_min, port_max)
    remotes = {
        key: value
        for key in ("remote_ip_prefix", "remote_group_id", "remote_address_group_id")
        if (value := obj.value.get(key)) is not None
    }
    if len(remotes) > 1:
        raise ValidationError(f"{what}: only one of {', '.join(sorted(remotes))} may be set")
    version = 4 if ethertype == "IPv4" else 6
    prefix = obj.maybe("remote_ip_prefix", lambda v, w: _prefix(v, w, version))
    return Rule(
        rule_id=obj.req("id", fields.neutron_id),
        direction=obj.req("direction", lambda v, w: fields.one_of(v, w, DIRECTIONS)),
        ethertype=ethertype,
        protocol=protocol,
        port_min=port_min,
        port_max=port_max,
        remote_ip_prefix=prefix,
        remote_group_id=obj.maybe("remote_group_id", fields.neutron_id),
        remote_address_group_id=obj.maybe("remote_address_group_id", fields.neutron_id),
    )


def protocol_number(value: Any, what: str) -> int | None:
    """Neutron's protocol field: a name, a number or a numeric string; None for "any"."""
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in ("", "any"):
            return None
        if lowered in PROTOCOL_NUMBERS:
            return PROTOCOL_NUMBERS[lowered]
        if not lowered.isdigit():
            raise fields.fail(what, f"unknown protocol {value!r}")
        value = int(lowered)
    return fields.integer(value, what, 0, 255)


def _port_field(value: Any, what: str) -> int:
    return fields.integer(value, what, 0, 65535)


def _check_ports(what: str, protocol: int | None, low: int | None, high: int | None) -> None:
    if low is None and high is None:
        return
    if protocol in (ICMP, ICMPV6):
        for value in (low, high):
            if value is not None and value > 255:
                raise ValidationError(f"{what}: ICMP type/code {value} is above 255")
        if low is None:
            raise ValidationError(f"{what}: an ICMP code needs an ICMP type")
        return
    if protocol not in PORT_PROTOCOLS:
        raise ValidationError(f"{what}: protocol {protocol} has no ports")
    if low is None or high is None or low > high or low < 1:
        raise ValidationError(f"{what}: port range {low}-{high} is not 1 <= min <= max")


def _prefix(value: Any, what: str, version: int) -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise fields.fail(what, f"{value!r} is not a prefix")
    # Neutron normalises host bits away; a value with them set is not Neutron's.
    return str(fields.cidr(value, what, version))


def parse_security_group(raw: bytes | str, sg_id: str | None = None) -> ParsedGroup:
    """The group with every rule that parses. The envelope itself must be sound (an id that
    matches its key, a rule list): if not, ValidationError, and the caller keeps denying."""
    what = f"security group {sg_id}" if sg_id else "security group"
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    found = obj.req("id", fields.neutron_id)
    if sg_id is not None and found != sg_id:
        raise ValidationError(f"{what}: id {found!r} does not match its key")
    raw_rules: list[Any] = obj.opt("rules", lambda v, w: fields.items(v, w, MAX_RULES), [])
    rules: list[Rule] = []
    problems: list[str] = []
    for index, item in enumerate(raw_rules):
        try:
            rules.append(parse_rule(item, f"{what}: rules[{index}]"))
        except ValidationError as exc:
            problems.append(str(exc))
    group = SecurityGroup(
        sg_id=found,
        rules=tuple(rules),
        stateful=obj.opt("stateful", fields.boolean, True),
        project_id=obj.maybe("project_id", fields.project_id),
        revision=obj.opt("revision", lambda v, w: fields.integer(v, w, 0, 2**63 - 1), 0),
    )
    return ParsedGroup(group, tuple(problems))


def address_list(value: Any, what: str) -> tuple[str, ...]:
    """CIDRs or host addresses, canonical; a bare address becomes /32 or /128."""
    return tuple(fields.each(value, what, fields.address_or_prefix, MAX_ADDRESSES))


def parse_group_member(raw: bytes | str, port_id: str | None = None) -> GroupMember:
    what = f"remote group member {port_id}" if port_id else "remote group member"
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    found = obj.req("port_id", fields.uuid)
    if port_id is not None and found != port_id:
        raise ValidationError(f"{what}: port_id {found!r} does not match its key")
    return GroupMember(found, obj.opt("addresses", address_list, ()))


def parse_address_group(raw: bytes | str, ag_id: str | None = None) -> AddressGroup:
    what = f"address group {ag_id}" if ag_id else "address group"
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    found = obj.req("id", fields.neutron_id)
    if ag_id is not None and found != ag_id:
        raise ValidationError(f"{what}: id {found!r} does not match its key")
    return AddressGroup(found, obj.opt("addresses", address_list, ()))
