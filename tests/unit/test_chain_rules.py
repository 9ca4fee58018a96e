"""Chain rules as typed values (``sgpolicy/rules.py``): what the compiler's rules say is read
from their fields, and nft's text of each is pinned here as the compiler wrote it when rules
were strings, so typing them changed nothing the kernel gets."""

from __future__ import annotations

import pytest

from podwire.agent import naming
from podwire.netfilter.elements import Addresses
from podwire.schema.ports import DesiredPort, FixedIp
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy import marks
from podwire.sgpolicy.compile import PolicyInputs, PortPolicy, compile_ruleset, policy_name
from podwire.sgpolicy.rules import (
    DROP,
    RETURN,
    AnyOf,
    ChainRule,
    ConnState,
    CtState,
    Drop,
    Equals,
    EtherType,
    GoTo,
    Icmpv6Type,
    InSet,
    IpProto,
    JumpTo,
    KeepMarkBits,
    NameStartsWith,
    PacketField,
    SetMarkBits,
    VerdictMap,
    text,
)

FF02 = Addresses(6, 0xFF02 << 112, (0xFF03 << 112) - 1)  # ff02::/16
SG = "5e5e5e5e-0000-4000-8000-000000000001"
OTHER = "5e5e5e5e-0000-4000-8000-000000000002"
PORT = DesiredPort(
    "5e5e5e5e-0000-4000-7000-000000000001",
    "5e5e5e5e-0000-4000-8000-0000000000ff",
    "fa:16:3e:00:00:01",
    1450,
    "vxlan",
    None,
    5,
    "veth",
    (FixedIp("10.0.0.1", "s", "10.0.0.0/24", None),),
    (SG,),
)
GROUP = SecurityGroup(
    SG,
    (
        Rule(f"{SG[:-1]}a", "ingress", "IPv4", 6, 22, 22, "10.0.0.0/8"),
        Rule(f"{SG[:-1]}b", "ingress", "IPv4", 1, 8, None, None),
        Rule(f"{SG[:-1]}c", "ingress", "IPv6", 17, 53, 53, None, OTHER),
        Rule(f"{SG[:-1]}d", "egress", "IPv4"),
    ),
)

# The fixed chains, as the compiler wrote them as strings.
FIXED = {
    ("bridge", "prerouting"): [
        'iifname "pwvx*" goto from_remote',
        "iifname @ports goto port_security",
    ],
    ("bridge", "from_remote"): ["iifname . ether saddr @remote_src return", "drop"],
    ("bridge", "port_security"): [
        "iifname . ether saddr != @src_mac counter drop",
        "udp sport 67 udp dport 68 counter drop",
        "udp sport 547 udp dport 546 counter drop",
        "icmpv6 type { nd-router-advert, nd-redirect } counter drop",
        "icmpv6 type nd-neighbor-advert jump nd_target",
        "ip6 saddr :: icmpv6 type nd-neighbor-solicit jump nd_target",
        "ether type ip iifname . ether saddr . ip saddr @src4 return",
        "ether type ip iifname . ether saddr . ip saddr @src4net return",
        "ether type ip ip saddr 0.0.0.0 ip daddr 255.255.255.255 udp sport 68 udp dport 67 return",
        "ether type ip6 iifname . ether saddr . ip6 saddr @src6 return",
        "ether type ip6 iifname . ether saddr . ip6 saddr @src6net return",
        "ether type ip6 ip6 saddr :: ip6 daddr ff02::/16 icmpv6 type { mld-listener-report,"
        " nd-neighbor-solicit, mld2-listener-report } return",
        "ether type arp iifname . arp saddr ether . arp saddr ip @src4 return",
        "ether type arp iifname . arp saddr ether . arp saddr ip @src4net return",
        "ether type arp arp saddr ip 0.0.0.0 return",
        "counter drop",
    ],
    ("bridge", "nd_target"): [
        "iifname . ether saddr . @th,64,128 @nd6 return",
        "iifname . ether saddr . @th,64,128 @nd6net return",
        "counter drop",
    ],
    ("bridge", "forward"): ["iifname @ports goto mark_ports", "oifname @ports goto mark_ports"],
    ("bridge", "mark_ports"): [
        "meta mark set meta mark and 0xf000f000",
        "oifname vmap @ports_rx",
        "iifname vmap @ports",
    ],
    ("bridge", "mark_1"): ["meta mark set meta mark | 0x1"],
    ("bridge", "mark_rx_1"): ["meta mark set meta mark | 0x10000"],
    ("inet", "forward"): ['iifname "pwbr*" jump bridged'],
    ("inet", "bridged"): [
        "meta mark and 0xfff vmap @egress",
        "meta mark and 0xfff0000 vmap @ingress",
        "meta mark set meta mark and 0xf000f000",
    ],
}


def _compiled() -> dict[tuple[str, str], tuple[ChainRule, ...]]:
    inputs = PolicyInputs(
        {SG: GROUP}, {}, {}, [PortPolicy(PORT, "pwp000000000001")], remote_macs={}
    )
    compiled = compile_ruleset(inputs, naming.DEVICES)
    return {key: chain.rules for key, chain in compiled.ruleset.chains.items()}


def test_the_fixed_chains_render_as_the_strings_they_were() -> None:
    chains = _compiled()
    assert {key: [text(rule) for rule in chains[key]] for key in FIXED} == FIXED


def test_a_policy_chain_is_typed_and_renders_as_it_was() -> None:
    name = policy_name((SG,))
    ingress = _compiled()[("inet", f"{name}_in")]
    fields = (PacketField.IP_SADDR, PacketField.L4PROTO, PacketField.TH_DPORT)
    assert ChainRule((InSet(fields, f"{name}_in4"),), verdict=RETURN) in ingress
    assert ingress[-1] == ChainRule(counter=True, verdict=DROP)  # only allows are compiled
    assert [text(rule) for rule in ingress] == [
        "icmpv6 type { mld-listener-query, nd-neighbor-solicit, nd-neighbor-advert,"
        " nd-router-advert } return",
        "udp sport 67 udp dport 68 return",
        "udp sport 547 udp dport 546 return",
        "ct state invalid counter drop",
        "ct state established,related return",
        f"ip saddr . meta l4proto . th dport @{name}_in4 return",
        f"ip saddr . icmp type . icmp code @{name}_in4i return",
        f"ip6 saddr @rg6_{OTHER} meta l4proto . th dport @{name}_in6g_{OTHER} return",
        "counter drop",
    ]
    egress = _compiled()[("inet", f"{name}_out")]
    assert [text(rule) for rule in egress][:1] == ["meta l4proto ipv6-icmp return"]


def test_without_remote_macs_nothing_from_vxlan_is_checked() -> None:
    inputs = PolicyInputs({SG: GROUP}, {}, {}, [PortPolicy(PORT, "pwp000000000001")])
    chains = compile_ruleset(inputs, naming.DEVICES).ruleset.chains
    assert [text(r) for r in chains[("bridge", "prerouting")].rules] == [
        "iifname @ports goto port_security"
    ]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (ChainRule(verdict=DROP), "drop"),
        (ChainRule((Equals(PacketField.ETHER_TYPE, EtherType.IP6),), verdict=RETURN),
         "ether type ip6 return"),
        (ChainRule((Equals(PacketField.L4PROTO, IpProto.IPV6_ICMP),), counter=True),
         "meta l4proto ipv6-icmp counter"),
        (ChainRule((Equals(PacketField.IP6_DADDR, FF02),)), "ip6 daddr ff02::/16"),
        (ChainRule((Equals(PacketField.UDP_DPORT, 53),), verdict=JumpTo("dns")),
         "udp dport 53 jump dns"),
        (ChainRule((AnyOf(PacketField.ICMPV6_TYPE, (Icmpv6Type.ND_REDIRECT, 1)),)),
         "icmpv6 type { nd-redirect, 1 }"),
        (ChainRule((InSet((PacketField.IIFNAME,), "ports", negated=True),), verdict=GoTo("x")),
         "iifname != @ports goto x"),
        (ChainRule((NameStartsWith(PacketField.OIFNAME, "pwp"),), verdict=RETURN),
         'oifname "pwp*" return'),
        (ChainRule((ConnState((CtState.RELATED, CtState.INVALID)),)), "ct state related,invalid"),
        (ChainRule(statement=SetMarkBits(0x20)), "meta mark set meta mark | 0x20"),
        (ChainRule(statement=KeepMarkBits(0xF)), "meta mark set meta mark and 0xf"),
        (marks.CLEAR, f"meta mark set meta mark and {marks.KEPT_BITS:#x}"),
        (ChainRule(verdict=VerdictMap(PacketField.IIFNAME, "ports")), "iifname vmap @ports"),
    ],
)  # fmt: skip
def test_each_kind_of_rule_renders(rule: ChainRule, expected: str) -> None:
    assert text(rule) == expected


def test_rules_that_mean_the_same_are_equal() -> None:
    def build() -> ChainRule:
        return ChainRule((Equals(PacketField.UDP_SPORT, 67),), counter=True, verdict=Drop())

    assert build() == build() and hash(build()) == hash(build())
    assert build() != ChainRule((Equals(PacketField.UDP_SPORT, 68),), counter=True, verdict=DROP)
