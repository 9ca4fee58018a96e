"""Policy in, nftables ruleset out: pure, so the semantics are unit-tested without a kernel.

Layout (docs/security-groups.md has the picture):

- ``bridge podwire``: every frame a port with port security sends is checked at the bridge's
  prerouting hook, where ``iifname`` is the port itself: its MAC, its (MAC, IP) pairs from
  fixed IPs and allowed address pairs (IPv4, IPv6 with the MACs' link-local addresses, ARP),
  neighbour advertisements only for those addresses, no DHCP server replies, router
  advertisements or redirects. At the bridge's forward hook, where both
  ports are known, the frame gets a mark: the ids of the sending and the receiving port's
  policies, each in its bits of the mark that podwire owns (``marks.py``). The kernel has no
  bridge conntrack (``ct`` is refused in the bridge family; docs/security-groups.md).
- ``inet podwire``: br_netfilter passes bridged IPv4/IPv6 through the inet forward hook with
  conntrack, but names the bridge there, not the port; the mark says which policies. Two
  verdict map lookups jump to the policy chain of the sender (egress) and of the receiver
  (ingress).

A policy is one set of security groups (ports with the same groups share it, as pools group
ports by SG set); its id and chains exist as long as a port has it, or while it is kept. So a
port plugged or removed changes nothing but elements of the bridge table's hash sets, the
cheapest change nf_tables has (addresses that are prefixes, from allowed address pairs, go to
interval sets of their own). Its chain does a fixed number of set lookups whatever the number
of rules or members: rules become elements of concatenated interval sets (address . protocol
. port), remote groups and address groups named sets of addresses. Only allows are compiled,
so a rule or group that is missing or bad leaves something denied, never allowed.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from podwire.errors import PermanentError
from podwire.netfilter.elements import (
    Addresses,
    Element,
    IfName,
    Jump,
    KeyField,
    Mac,
    Numbers,
)
from podwire.schema.ports import DesiredPort
from podwire.schema.secgroups import EGRESS, INGRESS, Rule, SecurityGroup
from podwire.sgpolicy import intervals, marks
from podwire.sgpolicy.marks import MAX_POLICY_ID
from podwire.sgpolicy.rules import (
    DROP,
    RETURN,
    AnyOf,
    ChainRule,
    ConnState,
    CtState,
    Equals,
    EtherType,
    GoTo,
    Icmpv6Type,
    InSet,
    IpProto,
    JumpTo,
    Match,
    NameStartsWith,
    PacketField,
    SetMarkBits,
    VerdictMap,
)
from podwire.sgpolicy.ruleset import NftChain, NftSet, Ruleset

FULL = {4: (0, 2**32 - 1), 6: (0, 2**128 - 1)}
ANY_PROTO = (0, 255)
ANY_PORT = (0, 65535)
ADDR_TYPE = {4: "ipv4_addr", 6: "ipv6_addr"}
SADDR = {4: PacketField.IP_SADDR, 6: PacketField.IP6_SADDR}
DADDR = {4: PacketField.IP_DADDR, 6: PacketField.IP6_DADDR}
ICMP_MATCH = {
    4: (PacketField.ICMP_TYPE, PacketField.ICMP_CODE),
    6: (PacketField.ICMPV6_TYPE, PacketField.ICMPV6_CODE),
}
ICMP_TYPES = {4: "icmp_type . icmp_code", 6: "icmpv6_type . icmpv6_code"}
PORTS_MATCH = (PacketField.L4PROTO, PacketField.TH_DPORT)
PORTS_TYPE = "inet_proto . inet_service"
PORT_KINDS = ("inet_proto", "inet_service")  # the fields of PORTS_TYPE and of ICMP_TYPES
ICMP_KINDS = {4: ("icmp_type", "icmp_code"), 6: ("icmpv6_type", "icmpv6_code")}
INTERVAL = "flags interval;"


@dataclass(frozen=True)
class PortPolicy:
    """A port this node enforces: its desired value and the host end of its veth (or tap)."""

    port: DesiredPort
    ifname: str


GroupSet = tuple[str, ...]


@dataclass(frozen=True)
class DevicePrefixes:
    """How the ruleset tells the devices the agent makes by their names (the agent's
    ``naming``): its bridges, where the inet table sees bridged frames, and its VXLAN
    devices, whose frames come from other nodes."""

    bridge: str
    vxlan: str


class TooManyPolicies(PermanentError):
    """More distinct sets of security groups on one node than a mark has room for."""


@dataclass
class PolicyInputs:
    groups: dict[str, SecurityGroup] = field(default_factory=dict)
    members: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    address_groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ports: list[PortPolicy] = field(default_factory=list)
    # Sets of groups whose chains stay although no port uses them now (the agent keeps a
    # set's chains a while after its last port left: the next pod of it adds elements only).
    kept: list[tuple[str, ...]] = field(default_factory=list)
    # The ids the last compilation gave its policies: kept for those that stay, so a port
    # coming or going never renumbers the others.
    policy_ids: dict[GroupSet, int] = field(default_factory=dict)
    # The MACs each VXLAN device may receive frames from: the other nodes' ports of its
    # network (None: not every node says which are its ports, so nothing is checked).
    remote_macs: dict[str, frozenset[str]] | None = None


@dataclass
class Compiled:
    ruleset: Ruleset
    problems: list[str]
    enforced: int  # ports with port security on
    policy_ids: dict[GroupSet, int]  # to pass in again with the next inputs


def compile_ruleset(inputs: PolicyInputs, devices: DevicePrefixes) -> Compiled:
    """Raises ``TooManyPolicies`` past 65,535 sets of groups on the node."""
    ruleset = Ruleset()
    problems: list[str] = []
    secured = secured_ports(inputs.ports)
    for item in secured:
        problems += [
            f"port {item.port.port_id}: security group {sg} is not published yet; its rules"
            " are not enforced (traffic they would allow is dropped)"
            for sg in group_set(item.port)
            if sg not in inputs.groups
        ]
    policies = {policy_name(sgs): sgs for sgs in policy_sets(inputs.ports, inputs.kept)}
    ids = policy_ids(inputs.policy_ids, set(policies.values()))
    _bridge_table(ruleset, secured, ids, inputs.remote_macs, devices)
    _inet_base(ruleset, devices)
    egress: set[Element] = set()
    ingress: set[Element] = set()
    referenced: dict[str, set[str]] = {"g": set(), "a": set()}
    for name, sg_ids in sorted(policies.items()):
        egress.add(_mark_jump(marks.sender(ids[sg_ids]), f"{name}_out"))
        ingress.add(_mark_jump(marks.receiver(ids[sg_ids]), f"{name}_in"))
        groups = tuple(inputs.groups[sg] for sg in sg_ids if sg in inputs.groups)
        for part in _policy(name, groups):
            if isinstance(part, NftSet):
                ruleset.add_set(part)
            else:
                ruleset.add_chain(part)
        for group in groups:
            for rule in group.rules:
                if rule.remote_group_id:
                    referenced["g"].add(rule.remote_group_id)
                if rule.remote_address_group_id:
                    referenced["a"].add(rule.remote_address_group_id)
    ruleset.add_set(NftSet("inet", "egress", "type mark : verdict;", frozenset(egress)))
    ruleset.add_set(NftSet("inet", "ingress", "type mark : verdict;", frozenset(ingress)))
    problems += _address_sets(ruleset, inputs, referenced)
    return Compiled(ruleset, problems, len(secured), ids)


def secured_ports(ports: list[PortPolicy]) -> list[PortPolicy]:
    """The ports that are filtered: the only ones with rules."""
    return [p for p in ports if p.port.filtered]


def policy_sets(ports: list[PortPolicy], kept: list[GroupSet]) -> set[GroupSet]:
    """The sets of groups that get a policy: those of secured ports, and the kept ones."""
    return {group_set(p.port) for p in secured_ports(ports)} | set(kept)


def policy_ids(previous: dict[GroupSet, int], needed: set[GroupSet]) -> dict[GroupSet, int]:
    """An id in 1..MAX_POLICY_ID for each needed set of groups: the one it had, else the
    lowest free."""
    ids = {sgs: previous[sgs] for sgs in needed if sgs in previous}
    taken = set(ids.values())
    free = (i for i in range(1, MAX_POLICY_ID + 1) if i not in taken)
    for sgs in sorted(needed - ids.keys()):
        found = next(free, None)
        if found is None:
            raise TooManyPolicies(f"more than {MAX_POLICY_ID} sets of security groups on a node")
        ids[sgs] = found
    return ids


def group_set(port: DesiredPort) -> tuple[str, ...]:
    """The set of groups a port's policy chains are shared by (order and repeats ignored)."""
    return _group_set(port.security_groups)


@lru_cache(maxsize=4096)
def _group_set(security_groups: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(set(security_groups)))


def policy_name(sg_ids: tuple[str, ...]) -> str:
    return "pol_" + hashlib.sha256("\n".join(sg_ids).encode()).hexdigest()[:12]


# -- the bridge table: port security and port marks ------------------------------------


def _bridge_table(
    ruleset: Ruleset,
    secured: list[PortPolicy],
    ids: dict[GroupSet, int],
    remote: dict[str, frozenset[str]] | None,
    devices: DevicePrefixes,
) -> None:
    hook_pre = "type filter hook prerouting priority -200; policy accept;"
    from_vxlan = NameStartsWith(_IIF, devices.vxlan)
    checked = () if remote is None else (ChainRule((from_vxlan,), verdict=GoTo("from_remote")),)
    ruleset.add_chain(NftChain("bridge", "prerouting", (*checked, _TO_PORT_SECURITY), hook_pre))
    # What arrives from another node carries the source MAC of one of its ports of that
    # network, as it published them: frames claiming any other MAC are dropped.
    ruleset.add_chain(NftChain("bridge", "from_remote", _FROM_REMOTE))
    elements = frozenset(
        Element((IfName(device), Mac(mac)))
        for device, macs in (remote or {}).items()
        for mac in macs
    )
    ruleset.add_set(NftSet("bridge", "remote_src", "type ifname . ether_addr;", elements))
    ruleset.add_chain(NftChain("bridge", "port_security", _PORT_SECURITY))
    ruleset.add_chain(NftChain("bridge", "nd_target", _ND_TARGET))
    hook_fwd = "type filter hook forward priority -200; policy accept;"
    ruleset.add_chain(NftChain("bridge", "forward", _TO_MARK_PORTS, hook_fwd))
    ruleset.add_chain(NftChain("bridge", "mark_ports", _MARK_PORTS))
    for policy in ids.values():
        sends, receives = marks.sender(policy), marks.receiver(policy)
        for chain, bits in ((f"mark_{policy}", sends), (f"mark_rx_{policy}", receives)):
            rule = ChainRule(statement=SetMarkBits(bits))
            ruleset.add_chain(NftChain("bridge", chain, (rule,)))
    per_port = [port_elements(item, ids[group_set(item.port)]) for item in secured]
    for name, spec in PORT_SETS.items():
        elements = frozenset().union(*(found[name] for found in per_port))
        ruleset.add_set(NftSet("bridge", name, spec, elements))


# An ND message's target address (``PacketField.ND_TARGET``): nft 1.0.6 (Debian 12) will not
# compare its raw payload with an ``ipv6_addr`` key, so the ND sets are declared by ``typeof``
# and hold the addresses as 128-bit integers, the same bytes.
ND_KEY = f"typeof iifname . ether saddr . {PacketField.ND_TARGET.value};"

# The bridge sets that hold a port's own elements, with their declarations.
PORT_SETS = {
    "ports": "type ifname : verdict;",  # the port as the sender: its policy's sender bits
    "ports_rx": "type ifname : verdict;",  # as the receiver
    "src_mac": "type ifname . ether_addr;",
    "src4": "type ifname . ether_addr . ipv4_addr;",
    "src4net": f"type ifname . ether_addr . ipv4_addr; {INTERVAL}",
    "src6": "type ifname . ether_addr . ipv6_addr;",
    "src6net": f"type ifname . ether_addr . ipv6_addr; {INTERVAL}",
    # The addresses a port may advertise (its IPv6 sources): an ND target outside them is
    # another node's address, which an advertisement with Override would take over.
    "nd6": ND_KEY,
    "nd6net": f"{ND_KEY} {INTERVAL}",
}


PortElements = dict[str, frozenset[Element]]  # PORT_SETS -> a port's elements of each
# (ifname, port id) -> (the DesiredPort and policy id they were made from, its elements): a
# change elsewhere re-uses every port's elements, so a rule change costs the same on 5 or 500
# ports.
_ELEMENTS: dict[tuple[str, str], tuple[DesiredPort, int, PortElements]] = {}


def port_elements(item: PortPolicy, policy_id: int) -> PortElements:
    """A secured port's elements of each of ``PORT_SETS``."""
    key = (item.ifname, item.port.port_id)
    cached = _ELEMENTS.get(key)
    if cached is not None and cached[0] is item.port and cached[1] == policy_id:
        return cached[2]
    if len(_ELEMENTS) > 16384:
        _ELEMENTS.clear()
    found = _sources(item)
    name = IfName(item.ifname)
    found["ports"] = frozenset({Element((name,), Jump(f"mark_{policy_id}"))})
    found["ports_rx"] = frozenset({Element((name,), Jump(f"mark_rx_{policy_id}"))})
    _ELEMENTS[key] = (item.port, policy_id, found)
    return found


def with_ports(
    base: Ruleset, gone: list[tuple[PortPolicy, int]], added: list[tuple[PortPolicy, int]]
) -> Ruleset:
    """``base`` with secured ports gone and added (each with its policy id), when nothing
    else differs: what ``compile_ruleset`` would give, without compiling the rest again."""
    removed: dict[str, set[Element]] = {name: set() for name in PORT_SETS}
    extra: dict[str, set[Element]] = {name: set() for name in PORT_SETS}
    for items, into in ((gone, removed), (added, extra)):
        for item, policy_id in items:
            for name, elements in port_elements(item, policy_id).items():
                into[name].update(elements)
    out = Ruleset(dict(base.sets), dict(base.chains))
    for name in PORT_SETS:
        if removed[name] or extra[name]:
            old = base.sets[("bridge", name)]
            elements = (old.elements - removed[name]) | extra[name]
            out.add_set(NftSet("bridge", name, old.spec, elements))
    return out


_IIF, _OIF = PacketField.IIFNAME, PacketField.OIFNAME
_PORT_SRC = (_IIF, PacketField.ETHER_SADDR)  # what a port's source sets are keyed on first


def _udp(sport: int, dport: int) -> tuple[Equals, Equals]:
    return Equals(PacketField.UDP_SPORT, sport), Equals(PacketField.UDP_DPORT, dport)


def _ether(kind: EtherType, *matches: Match) -> ChainRule:
    """Admits (returns to the caller) a frame of ``kind`` with ``matches``."""
    return ChainRule((Equals(PacketField.ETHER_TYPE, kind), *matches), verdict=RETURN)


def _address(version: int, cidr: str) -> Addresses:
    return Addresses(version, *intervals.prefix_span(cidr))


_COUNTED_DROP = ChainRule(counter=True, verdict=DROP)
_TO_PORT_SECURITY = ChainRule((InSet((_IIF,), "ports"),), verdict=GoTo("port_security"))
_FROM_REMOTE = (
    ChainRule((InSet(_PORT_SRC, "remote_src"),), verdict=RETURN),
    ChainRule(verdict=DROP),
)
# Only frames from or to a port podwire enforces get its mark (there is no bridge name match in
# this kernel's bridge family).
_TO_MARK_PORTS = (
    ChainRule((InSet((_IIF,), "ports"),), verdict=GoTo("mark_ports")),
    ChainRule((InSet((_OIF,), "ports"),), verdict=GoTo("mark_ports")),
)
# Two maps give both ends their policy id in their own bits, the other bits kept (a port that
# is not podwire's adds nothing).
_MARK_PORTS = (
    marks.CLEAR,
    ChainRule(verdict=VerdictMap(_OIF, "ports_rx")),
    ChainRule(verdict=VerdictMap(_IIF, "ports")),
)
_ND_PROBES = (
    Icmpv6Type.MLD_LISTENER_REPORT,
    Icmpv6Type.ND_NEIGHBOR_SOLICIT,
    Icmpv6Type.MLD2_LISTENER_REPORT,
)
# What a port with port security may send (Neutron's spoofing rules, in one chain).
_PORT_SECURITY = (
    ChainRule((InSet(_PORT_SRC, "src_mac", negated=True),), counter=True, verdict=DROP),
    ChainRule(_udp(67, 68), counter=True, verdict=DROP),  # a DHCP server in a pod
    ChainRule(_udp(547, 546), counter=True, verdict=DROP),
    # a pod is no router: no advertisements, no redirects
    ChainRule(
        (AnyOf(PacketField.ICMPV6_TYPE, (Icmpv6Type.ND_ROUTER_ADVERT, Icmpv6Type.ND_REDIRECT)),),
        counter=True,
        verdict=DROP,
    ),
    # advertisements, and DAD probes (the address a node is about to take), only for the
    # port's own addresses; a solicitation that resolves a neighbour names the neighbour's
    # address, and its source is checked below like any other
    ChainRule(
        (Equals(PacketField.ICMPV6_TYPE, Icmpv6Type.ND_NEIGHBOR_ADVERT),),
        verdict=JumpTo("nd_target"),
    ),
    ChainRule(
        (
            Equals(PacketField.IP6_SADDR, _address(6, "::/128")),
            Equals(PacketField.ICMPV6_TYPE, Icmpv6Type.ND_NEIGHBOR_SOLICIT),
        ),
        verdict=JumpTo("nd_target"),
    ),
    _ether(EtherType.IP, InSet((*_PORT_SRC, PacketField.IP_SADDR), "src4")),
    _ether(EtherType.IP, InSet((*_PORT_SRC, PacketField.IP_SADDR), "src4net")),
    _ether(
        EtherType.IP,
        Equals(PacketField.IP_SADDR, _address(4, "0.0.0.0/32")),
        Equals(PacketField.IP_DADDR, _address(4, "255.255.255.255/32")),
        *_udp(68, 67),
    ),
    _ether(EtherType.IP6, InSet((*_PORT_SRC, PacketField.IP6_SADDR), "src6")),
    _ether(EtherType.IP6, InSet((*_PORT_SRC, PacketField.IP6_SADDR), "src6net")),
    _ether(
        EtherType.IP6,
        Equals(PacketField.IP6_SADDR, _address(6, "::/128")),
        Equals(PacketField.IP6_DADDR, _address(6, "ff02::/16")),
        AnyOf(PacketField.ICMPV6_TYPE, _ND_PROBES),
    ),
    _ether(EtherType.ARP, InSet((_IIF, PacketField.ARP_SHA, PacketField.ARP_SPA), "src4")),
    _ether(EtherType.ARP, InSet((_IIF, PacketField.ARP_SHA, PacketField.ARP_SPA), "src4net")),
    # ARP probes (address conflict detection)
    _ether(EtherType.ARP, Equals(PacketField.ARP_SPA, _address(4, "0.0.0.0/32"))),
    _COUNTED_DROP,
)
# Returns to port_security when the ND target is one of the sender's addresses.
_ND_TARGET = (
    ChainRule((InSet((*_PORT_SRC, PacketField.ND_TARGET), "nd6"),), verdict=RETURN),
    ChainRule((InSet((*_PORT_SRC, PacketField.ND_TARGET), "nd6net"),), verdict=RETURN),
    _COUNTED_DROP,
)


def _sources(item: PortPolicy) -> PortElements:
    """What the port may send from: single addresses go to the exact sets, prefixes (address
    pairs, a port without IPs) to the interval sets."""
    macs, spans = source_spans(item.port)
    out: dict[str, set[Element]] = {name: set() for name in PORT_SETS if name != "ports"}
    device = IfName(item.ifname)
    out["src_mac"] = {Element((device, Mac(mac))) for mac in macs}
    for (mac, version), found in spans.items():
        for low, high in found:
            exact = low == high
            head = (device, Mac(mac))
            out[f"src{version}" if exact else f"src{version}net"].add(
                Element((*head, Addresses(version, low, high)))
            )
            if version == 6:  # an ND set's key: the address as a raw 128-bit payload
                target = Numbers("integer128", low, high)
                out["nd6" if exact else "nd6net"].add(Element((*head, target)))
    return {name: frozenset(elements) for name, elements in out.items()}


SourceSpans = dict[tuple[str, int], list[intervals.Span]]  # (MAC, IP version) -> addresses


def source_spans(port: DesiredPort) -> tuple[set[str], SourceSpans]:
    """The MACs a filtered port may send from, and for each MAC and IP version the addresses
    (merged spans): fixed IPs, allowed address pairs (with their own MAC, if they name one),
    any address for a port without IPs (Neutron's rule), each MAC's link-local address."""
    pairs = [(port.mac_address, ip.ip_address) for ip in port.fixed_ips]
    pairs += [(p.mac_address or port.mac_address, p.ip_address) for p in port.allowed_address_pairs]
    if not port.fixed_ips:  # Neutron: a port without IPs may use any IP with its MAC
        pairs += [(port.mac_address, "0.0.0.0/0"), (port.mac_address, "::/0")]
    macs = {port.mac_address} | {mac for mac, _ in pairs}
    pairs += [(mac, link_local(mac)) for mac in macs]
    spans: SourceSpans = {}
    for mac, address in pairs:
        net = ipaddress.ip_network(address, strict=False)
        spans.setdefault((mac, net.version), []).append(intervals.prefix_span(str(net)))
    return macs, {key: intervals.merge(found) for key, found in spans.items()}


def _mark_jump(mark: int, chain: str) -> Element:
    return Element((Numbers("mark", mark, mark),), Jump(chain))


def link_local(mac: str) -> str:
    """The EUI-64 link-local address the kernel gives an interface with this MAC."""
    octets = [int(part, 16) for part in mac.split(":")]
    octets[0] ^= 0x02
    eui = [*octets[:3], 0xFF, 0xFE, *octets[3:]]
    suffix = int.from_bytes(bytes(eui), "big")
    return str(ipaddress.IPv6Address((0xFE80 << 112) | suffix))


# -- the inet table: stateful security groups -------------------------------------------


def _inet_base(ruleset: Ruleset, devices: DevicePrefixes) -> None:
    hook = "type filter hook forward priority -10; policy accept;"
    bridged = ChainRule((NameStartsWith(_IIF, devices.bridge),), verdict=JumpTo("bridged"))
    ruleset.add_chain(NftChain("inet", "forward", (bridged,), hook))
    ruleset.add_chain(NftChain("inet", "bridged", _BRIDGED))


_BRIDGED = (
    ChainRule(verdict=VerdictMap(PacketField.MARK, "egress", marks.SENDER_BITS)),
    ChainRule(verdict=VerdictMap(PacketField.MARK, "ingress", marks.RECEIVER_BITS)),
    # podwire's bits mean something only here; nothing after us sees them.
    marks.CLEAR,
)


# What Neutron admits before and regardless of the groups' rules.
_NEIGHBOURS = (
    Icmpv6Type.MLD_LISTENER_QUERY,
    Icmpv6Type.ND_NEIGHBOR_SOLICIT,
    Icmpv6Type.ND_NEIGHBOR_ADVERT,
    Icmpv6Type.ND_ROUTER_ADVERT,
)
_FIXED_IN = (
    ChainRule((AnyOf(PacketField.ICMPV6_TYPE, _NEIGHBOURS),), verdict=RETURN),
    ChainRule(_udp(67, 68), verdict=RETURN),  # DHCP answers to the port's client
    ChainRule(_udp(547, 546), verdict=RETURN),
)
_FIXED_OUT = (
    # router advertisements were dropped at the bridge
    ChainRule((Equals(PacketField.L4PROTO, IpProto.IPV6_ICMP),), verdict=RETURN),
    ChainRule(_udp(68, 67), verdict=RETURN),  # the port's DHCP client
    ChainRule(_udp(546, 547), verdict=RETURN),
)
_STATEFUL = (
    ChainRule((ConnState((CtState.INVALID,)),), counter=True, verdict=DROP),
    ChainRule((ConnState((CtState.ESTABLISHED, CtState.RELATED)),), verdict=RETURN),
)


def policy_stateful(groups: Iterable[SecurityGroup]) -> bool:
    """Whether a policy tracks connections: only if every one of its groups is stateful
    (Neutron's ``stateful`` flag; a port may not mix them, so this is the port's groups')."""
    return all(g.stateful for g in groups)


def port_groups(inputs: PolicyInputs, port: DesiredPort) -> tuple[SecurityGroup, ...]:
    """The port's groups that are published, in its policy's order."""
    return tuple(inputs.groups[sg] for sg in group_set(port) if sg in inputs.groups)


@lru_cache(maxsize=1024)
def _policy(name: str, groups: tuple[SecurityGroup, ...]) -> tuple[NftSet | NftChain, ...]:
    """The chains and sets of one policy; cached, since most changes leave most policies."""
    stateful = policy_stateful(groups)
    rules = [rule for group in groups for rule in group.rules]
    parts: list[NftSet | NftChain] = []
    for direction, short, fixed in ((INGRESS, "in", _FIXED_IN), (EGRESS, "out", _FIXED_OUT)):
        chosen = [r for r in rules if r.direction == direction]
        matches, sets = _direction(f"{name}_{short}", chosen, direction)
        body = fixed + (_STATEFUL if stateful else ()) + tuple(matches) + (_COUNTED_DROP,)
        parts.append(NftChain("inet", f"{name}_{short}", body))
        parts += sets
    return tuple(parts)


def _direction(
    base: str, rules: list[Rule], direction: str
) -> tuple[list[ChainRule], list[NftSet]]:
    addr = SADDR if direction == INGRESS else DADDR
    matches: list[ChainRule] = []
    sets: list[NftSet] = []
    for version, ethertype in ((4, "IPv4"), (6, "IPv6")):
        family = [r for r in rules if r.ethertype == ethertype]
        prefixed = [r for r in family if not r.remote_group_id and not r.remote_address_group_id]
        name = f"{base}{version}"
        ports, icmp = _prefixed_elements(prefixed, version)
        if ports:
            sets.append(
                NftSet("inet", name, f"type {ADDR_TYPE[version]} . {PORTS_TYPE}; {INTERVAL}", ports)
            )
            matches.append(_admit(InSet((addr[version], *PORTS_MATCH), name)))
        if icmp:
            spec = f"type {ADDR_TYPE[version]} . {ICMP_TYPES[version]}; {INTERVAL}"
            sets.append(NftSet("inet", f"{name}i", spec, icmp))
            matches.append(_admit(InSet((addr[version], *ICMP_MATCH[version]), f"{name}i")))
        for kind, key in (("g", "remote_group_id"), ("a", "remote_address_group_id")):
            by_remote: dict[str, list[Rule]] = {}
            for rule in family:
                remote = getattr(rule, key)
                if remote:
                    by_remote.setdefault(remote, []).append(rule)
            for remote, chosen in sorted(by_remote.items()):
                source = InSet((addr[version],), address_set_name(kind, version, remote))
                set_name = f"{name}{kind}_{remote}"
                ports, icmp = _remote_elements(chosen, version)
                if ports:
                    sets.append(NftSet("inet", set_name, f"type {PORTS_TYPE}; {INTERVAL}", ports))
                    matches.append(_admit(source, InSet(PORTS_MATCH, set_name)))
                if icmp:
                    spec = f"type {ICMP_TYPES[version]}; {INTERVAL}"
                    sets.append(NftSet("inet", f"{set_name}i", spec, icmp))
                    matches.append(_admit(source, InSet(ICMP_MATCH[version], f"{set_name}i")))
    return matches, sets


def _admit(*lookups: InSet) -> ChainRule:
    return ChainRule(lookups, verdict=RETURN)


def address_set_name(kind: str, version: int, group_id: str) -> str:
    return f"{'rg' if kind == 'g' else 'ag'}{version}_{group_id}"


# -- elements -------------------------------------------------------------------------


Box = tuple[tuple[intervals.Span, ...], intervals.Span]  # (protocol/port spans, addresses)


def rule_boxes(rules: Iterable[Rule], version: int) -> tuple[list[Box], list[Box]]:
    """Each rule as a box: (protocol, port) for the ports set or (ICMP type, code) for the
    ICMP set, with its address span (the whole family without a prefix)."""
    ports: list[Box] = []
    icmp: list[Box] = []
    for rule in rules:
        address = (
            intervals.prefix_span(rule.remote_ip_prefix) if rule.remote_ip_prefix else FULL[version]
        )
        if rule.protocol is None:
            ports.append(((ANY_PROTO, ANY_PORT), address))
        elif rule.is_icmp and rule.port_min is not None:
            code = (rule.port_max, rule.port_max) if rule.port_max is not None else (0, 255)
            icmp.append((((rule.port_min, rule.port_min), code), address))
        elif rule.port_min is not None and rule.port_max is not None:
            ports.append(
                (((rule.protocol, rule.protocol), (rule.port_min, rule.port_max)), address)
            )
        else:  # a protocol without ports, or ICMP of any type
            ports.append((((rule.protocol, rule.protocol), ANY_PORT), address))
    return ports, icmp


def _disjoint(boxes: list[Box]) -> list[Box]:
    """The union of ``boxes`` as disjoint boxes: cut along protocol (or ICMP type), then port
    (or code), then merge the addresses of what covers each piece. A rule from anywhere stays
    one element, however many prefixes other rules name."""
    if not boxes:
        return []
    if not boxes[0][0]:
        return [((), span) for span in intervals.merge(address for _, address in boxes)]
    out: list[Box] = []
    cut = intervals.sweep([(dims[0], (dims[1:], address)) for dims, address in boxes])
    for span, covering in cut:
        out += [((span, *rest), address) for rest, address in _disjoint(covering)]
    return out


def _element(box: Box, kinds: tuple[str, ...], version: int | None) -> Element:
    """A box as an element: its address range (unless the addresses come from a group's own
    set), then its protocol and port (or ICMP type and code) ranges."""
    fields: list[KeyField] = [
        Numbers(kind, *span) for kind, span in zip(kinds, box[0], strict=True)
    ]
    if version is not None:
        fields.insert(0, Addresses(version, *box[1]))
    return Element(tuple(fields))


def _elements_of(
    ports: list[Box], icmp: list[Box], version: int, with_addresses: bool
) -> tuple[frozenset[Element], frozenset[Element]]:
    address = version if with_addresses else None
    kinds = ICMP_KINDS[version]
    return (
        frozenset(_element(box, PORT_KINDS, address) for box in _disjoint(ports)),
        frozenset(_element(box, kinds, address) for box in _disjoint(icmp)),
    )


def _prefixed_elements(
    rules: list[Rule], version: int
) -> tuple[frozenset[Element], frozenset[Element]]:
    ports, icmp = rule_boxes(rules, version)
    return _elements_of(ports, icmp, version, with_addresses=True)


def _remote_elements(
    rules: list[Rule], version: int
) -> tuple[frozenset[Element], frozenset[Element]]:
    """For rules naming a group: the addresses come from the group's set, not the rule."""
    ports, icmp = rule_boxes(rules, version)
    ports = [(dims, FULL[version]) for dims, _ in ports]
    icmp = [(dims, FULL[version]) for dims, _ in icmp]
    return _elements_of(ports, icmp, version, with_addresses=False)


def _address_sets(
    ruleset: Ruleset, inputs: PolicyInputs, referenced: dict[str, set[str]]
) -> list[str]:
    """One named set per referenced remote group / address group and family, kept current."""
    problems = []
    for kind, ids in referenced.items():
        for group_id in sorted(ids):
            addresses, problem = remote_addresses(inputs, kind, group_id)
            problems += [problem] if problem else []
            for version in (4, 6):
                elements = frozenset(
                    Element((Addresses(version, *span),))
                    for span in address_spans(addresses, version)
                )
                name = address_set_name(kind, version, group_id)
                ruleset.add_set(
                    NftSet("inet", name, f"type {ADDR_TYPE[version]}; {INTERVAL}", elements)
                )
    return problems


def remote_addresses(inputs: PolicyInputs, kind: str, group_id: str) -> tuple[list[str], str]:
    """The addresses of a remote group's members (``kind`` "g") or of an address group
    ("a"), and a problem to report if it is not published (empty if it is)."""
    if kind == "g":
        found = inputs.members.get(group_id)
        addresses = [a for member in (found or {}).values() for a in member]
        if not found and group_id not in inputs.groups:
            return addresses, (
                f"remote group {group_id} is not published yet: rules naming it match nothing"
            )
        return addresses, ""
    found_ag = inputs.address_groups.get(group_id)
    if found_ag is None:
        return [], f"address group {group_id} is not published yet: rules naming it match nothing"
    return list(found_ag), ""


def address_spans(addresses: Iterable[str], version: int) -> list[intervals.Span]:
    """The addresses of one IP version as merged spans."""
    return intervals.merge(
        intervals.prefix_span(a)
        for a in addresses
        if ipaddress.ip_network(a, strict=False).version == version
    )
