"""Chain rules as typed values, and the one place they become nft text.

The compiler builds each rule of podwire's chains from frozen dataclasses, as it builds set
elements from ``netfilter.elements``: what a packet field is compared with, which named set it
is looked up in, what the rule does then. Rules that mean the same compare equal, tests read
their fields instead of parsing text, and ``text`` renders them for libnftables; another
renderer (a classifier in the memif master, #38) can take the same values.

A rule is its matches (all must hold), an optional counter, an optional statement on the
packet mark, and an optional verdict (without one, the packet goes on to the next rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from podwire.netfilter.elements import Addresses


class PacketField(Enum):
    """What a rule reads of a packet, as nft names it."""

    IIFNAME = "iifname"
    OIFNAME = "oifname"
    MARK = "meta mark"
    L4PROTO = "meta l4proto"
    ETHER_SADDR = "ether saddr"
    ETHER_TYPE = "ether type"
    ARP_SHA = "arp saddr ether"
    ARP_SPA = "arp saddr ip"
    IP_SADDR = "ip saddr"
    IP_DADDR = "ip daddr"
    IP6_SADDR = "ip6 saddr"
    IP6_DADDR = "ip6 daddr"
    UDP_SPORT = "udp sport"
    UDP_DPORT = "udp dport"
    TH_DPORT = "th dport"
    ICMP_TYPE = "icmp type"
    ICMP_CODE = "icmp code"
    ICMPV6_TYPE = "icmpv6 type"
    ICMPV6_CODE = "icmpv6 code"
    # The target address of a neighbour solicitation or advertisement (RFC 4861 4.3, 4.4:
    # after type, code, checksum and 32 bits of flags), a raw payload: nft 1.0.6 has no name
    # for it.
    ND_TARGET = "@th,64,128"


# Numbers nft names: each is written as its member's name in lower case, "_" as "-".
class EtherType(IntEnum):
    IP = 0x0800
    ARP = 0x0806
    IP6 = 0x86DD


class IpProto(IntEnum):
    IPV6_ICMP = 58


class Icmpv6Type(IntEnum):
    MLD_LISTENER_QUERY = 130
    MLD_LISTENER_REPORT = 131
    ND_ROUTER_ADVERT = 134
    ND_NEIGHBOR_SOLICIT = 135
    ND_NEIGHBOR_ADVERT = 136
    ND_REDIRECT = 137
    MLD2_LISTENER_REPORT = 143


class CtState(Enum):
    INVALID = "invalid"
    ESTABLISHED = "established"
    RELATED = "related"


Constant = int | Addresses  # an int may be one of the IntEnums above


# -- matches ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Equals:
    """The field is this value (an address may be a prefix)."""

    field: PacketField
    value: Constant


@dataclass(frozen=True)
class AnyOf:
    """The field is one of these values (an anonymous set)."""

    field: PacketField
    values: tuple[Constant, ...]


@dataclass(frozen=True)
class InSet:
    """The fields, concatenated, are (or with ``negated`` are not) an element of a named set."""

    fields: tuple[PacketField, ...]
    set_name: str
    negated: bool = False


@dataclass(frozen=True)
class NameStartsWith:
    """An interface name (``iifname``, ``oifname``) begins with ``prefix``."""

    field: PacketField
    prefix: str


@dataclass(frozen=True)
class ConnState:
    """Conntrack's state of the packet's connection is one of these."""

    states: tuple[CtState, ...]


Match = Equals | AnyOf | InSet | NameStartsWith | ConnState


# -- statements on the mark, and verdicts ----------------------------------------------


@dataclass(frozen=True)
class SetMarkBits:
    """The mark gets these bits too; the others stay."""

    bits: int


@dataclass(frozen=True)
class KeepMarkBits:
    """The mark keeps only these bits."""

    bits: int


MarkStatement = SetMarkBits | KeepMarkBits


@dataclass(frozen=True)
class Drop:
    pass


@dataclass(frozen=True)
class Return:
    """Back to the chain that jumped here; in a base chain, the hook's policy (accept)."""


@dataclass(frozen=True)
class JumpTo:
    chain: str


@dataclass(frozen=True)
class GoTo:
    """To ``chain``, which returns to this chain's caller, not here."""

    chain: str


@dataclass(frozen=True)
class VerdictMap:
    """The verdict the named map gives for the field (masked first, when ``mask`` is set);
    none, when the map has no element for it."""

    field: PacketField
    map_name: str
    mask: int | None = None


Verdict = Drop | Return | JumpTo | GoTo | VerdictMap
DROP = Drop()
RETURN = Return()


@dataclass(frozen=True)
class ChainRule:
    matches: tuple[Match, ...] = ()
    counter: bool = False
    statement: MarkStatement | None = None
    verdict: Verdict | None = None


# -- nft text --------------------------------------------------------------------------


def text(rule: ChainRule) -> str:
    """The rule as nft writes it (what ``add rule <chain>`` takes)."""
    parts = [_match(match) for match in rule.matches]
    if rule.counter:
        parts.append("counter")
    if rule.statement is not None:
        parts.append(_statement(rule.statement))
    if rule.verdict is not None:
        parts.append(_verdict(rule.verdict))
    return " ".join(parts)


def _match(match: Match) -> str:
    if isinstance(match, Equals):
        return f"{match.field.value} {_constant(match.value)}"
    if isinstance(match, AnyOf):
        return f"{match.field.value} {{ {', '.join(_constant(v) for v in match.values)} }}"
    if isinstance(match, InSet):
        fields = " . ".join(field.value for field in match.fields)
        return f"{fields} {'!= ' if match.negated else ''}@{match.set_name}"
    if isinstance(match, NameStartsWith):
        return f'{match.field.value} "{match.prefix}*"'
    return "ct state " + ",".join(state.value for state in match.states)


def _constant(value: Constant) -> str:
    if isinstance(value, Addresses):
        return value.text()
    if isinstance(value, IntEnum):
        return value.name.lower().replace("_", "-")
    return str(value)


def _statement(statement: MarkStatement) -> str:
    if isinstance(statement, SetMarkBits):
        return f"meta mark set meta mark | {statement.bits:#x}"
    return f"meta mark set meta mark and {statement.bits:#x}"


def _verdict(verdict: Verdict) -> str:
    if isinstance(verdict, Drop):
        return "drop"
    if isinstance(verdict, Return):
        return "return"
    if isinstance(verdict, JumpTo):
        return f"jump {verdict.chain}"
    if isinstance(verdict, GoTo):
        return f"goto {verdict.chain}"
    mask = "" if verdict.mask is None else f" and {verdict.mask:#x}"
    return f"{verdict.field.value}{mask} vmap @{verdict.map_name}"
