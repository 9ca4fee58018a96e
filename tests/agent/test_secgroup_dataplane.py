"""The compiled ruleset in a real kernel: packets between pods on one bridge, no agent.

What the agent's enforcer applies is exactly ``ruleset.replace`` / ``ruleset.change`` of
``compile_ruleset``; these tests apply them with libnftables in a host namespace and send
real TCP, UDP, ICMP and ICMPv6 over IPv4 and IPv6.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from podwire.agent import naming
from podwire.agent.policy.enforcer import apply_change
from podwire.netfilter import Nftables
from podwire.schema.ports import AddressPair
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy import ruleset
from podwire.sgpolicy.compile import PolicyInputs, compile_ruleset
from tests.agent.netenv import NetEnv, in_ns
from tests.agent.sgnet import SgHost, nft_shape, ping, reaches

WEB = "0e0e0e0e-0000-4000-8000-000000000001"
OTHER = "0e0e0e0e-0000-4000-8000-000000000002"
SINK = "0e0e0e0e-0000-4000-8000-000000000003"  # ingress only: no egress rule at all


def _rid(n: int) -> str:
    return f"0e0e0e0e-0000-4000-9000-{n:012d}"


def _web_rules(extra_tcp: tuple[int, ...] = ()) -> tuple[Rule, ...]:
    rules = [
        Rule(_rid(1), "ingress", "IPv4", 6, 5001, 5001, None),  # TCP from anywhere
        Rule(_rid(2), "ingress", "IPv6", 17, 5353, 5353, "fd00:9::/64"),  # UDP, v6 prefix
        Rule(_rid(3), "ingress", "IPv6", 58, 128, None, None, WEB),  # echo request, group
        Rule(_rid(4), "ingress", "IPv4", 17, 6000, 6100, "10.9.0.0/28"),  # UDP range, prefix
        Rule(_rid(5), "egress", "IPv4"),
        Rule(_rid(6), "egress", "IPv6"),
    ]
    rules += [Rule(_rid(10 + p), "ingress", "IPv4", 6, p, p, None) for p in extra_tcp]
    return tuple(rules)


@pytest.fixture
def host(netenv: NetEnv) -> Iterator[SgHost]:
    found = SgHost(netenv)
    found.start()
    try:
        yield found
    finally:
        found.stop()


def _inputs(host: SgHost, web: SecurityGroup, members: list[str]) -> PolicyInputs:
    groups = {
        WEB: web,
        OTHER: SecurityGroup(OTHER, (Rule(_rid(7), "egress", "IPv4"),)),
        SINK: SecurityGroup(SINK, (Rule(_rid(8), "ingress", "IPv4", 6, 5001, 5001, None),)),
    }
    addresses = {f"m{i}": (f"{a}/128" if ":" in a else f"{a}/32",) for i, a in enumerate(members)}
    return PolicyInputs(groups, {WEB: addresses}, {}, [p.policy() for p in host.pods])


async def test_rules_groups_prefixes_and_port_security(host: SgHost) -> None:
    pair = AddressPair("10.9.0.100/32", "fa:16:3e:00:00:01")
    a = host.pod(1, security_groups=(WEB,), pairs=(pair,))
    b = host.pod(2, security_groups=(WEB,))
    c = host.pod(3, security_groups=(OTHER,))
    d = host.pod(20, port_security=False)
    e = host.pod(5, security_groups=(SINK,))
    for proto, port in (("tcp", 5001), ("tcp", 5002), ("udp", 5353), ("udp", 6050)):
        host.serve(b, proto, port)
    host.serve(d, "tcp", 5001)
    host.serve(e, "tcp", 5001)
    host.serve(a, "tcp", 5001)
    nft = Nftables(host.ns)
    try:
        web = SecurityGroup(WEB, _web_rules())
        first = compile_ruleset(_inputs(host, web, [a.ip6, b.ip6]), naming.DEVICES)
        assert first.problems == [] and first.enforced == 4
        await nft.apply(ruleset.replace(first.ruleset))

        # rule by protocol and port; replies pass although b has no egress rule for them
        assert reaches(a, "tcp", b.ip4, 5001) and reaches(c, "tcp", b.ip4, 5001)
        assert not reaches(a, "tcp", b.ip4, 5002)
        # stateful: e answers without any egress rule, but cannot open a flow itself
        assert reaches(a, "tcp", e.ip4, 5001) and not reaches(e, "tcp", a.ip4, 5001)
        # UDP by IPv6 prefix, UDP port range by IPv4 prefix; c (10.9.0.3) is inside /28
        assert reaches(a, "udp", b.ip6, 5353)
        assert reaches(c, "udp", b.ip4, 6050)
        # ICMPv6 echo by remote group: a is a member, c is not; no ICMPv4 rule at all
        assert ping(a, b.ip6) and not ping(c, b.ip6)
        assert not ping(a, b.ip4)
        # port security off: d is not filtered either way, and may send from any address
        assert ping(b, d.ip4) and reaches(a, "tcp", d.ip4, 5001)
        in_ns(d.ns, "ip", "addr", "add", "10.9.0.77/24", "dev", "eth0")
        assert reaches(d, "tcp", b.ip4, 5001, source="10.9.0.77")
        # spoofed source IP dropped, the allowed address pair accepted
        in_ns(a.ns, "ip", "addr", "add", "10.9.0.100/24", "dev", "eth0")
        in_ns(a.ns, "ip", "addr", "add", "10.9.0.101/24", "dev", "eth0")
        assert reaches(a, "tcp", b.ip4, 5001, source="10.9.0.100")
        assert not reaches(a, "tcp", b.ip4, 5001, source="10.9.0.101")

        # one change: a rule added, a member removed; applied as a difference
        web2 = SecurityGroup(WEB, _web_rules((5002,)))
        second = compile_ruleset(_inputs(host, web2, [b.ip6]), naming.DEVICES)
        change = ruleset.change(first.ruleset, second.ruleset)
        assert change is not None and change.text()
        await apply_change(nft, change)
        assert reaches(a, "tcp", b.ip4, 5002)
        assert not ping(a, b.ip6)  # a new echo id: a new flow, no longer admitted

        # spoofed MAC: everything from it is dropped at the bridge port
        in_ns(c.ns, "ip", "link", "set", "eth0", "address", "fa:16:3e:00:00:99")
        in_ns(c.ns, "ip", "neigh", "flush", "all")
        assert not reaches(c, "tcp", b.ip4, 5001)
    finally:
        nft.close()


async def test_change_reaches_what_replace_builds(host: SgHost) -> None:
    """Whatever the difference, the kernel ends where a fresh replace would have put it."""
    pods = [host.pod(i, security_groups=(WEB,) if i % 2 else (OTHER,)) for i in range(1, 5)]
    nft = Nftables(host.ns)
    try:
        web = SecurityGroup(WEB, _web_rules())
        old = compile_ruleset(_inputs(host, web, [p.ip4 for p in pods]), naming.DEVICES)
        await nft.apply(ruleset.replace(old.ruleset))
        host.pods.pop()  # a port goes, its policy with it; rules and members change
        new = compile_ruleset(
            _inputs(host, SecurityGroup(WEB, _web_rules((22, 80))), [pods[0].ip4]), naming.DEVICES
        )
        change = ruleset.change(old.ruleset, new.ruleset)
        assert change is not None and change.text()
        await apply_change(nft, change)
        after_change = await nft.query("list ruleset")
        await nft.apply(ruleset.replace(new.ruleset))
        after_replace = await nft.query("list ruleset")
        assert nft_shape(after_change) == nft_shape(after_replace)
    finally:
        nft.close()
