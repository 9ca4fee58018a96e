"""The security-group compiler without a kernel: policy in, nft ruleset out.

Properties: the elements of every interval set are disjoint (nft refuses overlaps) and admit
exactly the union of the rules; bad values never raise and never admit anything; a missing
group or remote group denies; ``change`` from a ruleset to itself is empty.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podwire.agent import naming
from podwire.etcd import KeyValue, WatchEvent
from podwire.netfilter.elements import Element
from podwire.schema.ports import AddressPair, DesiredPort, FixedIp
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy import intervals, ruleset
from podwire.sgpolicy.compile import (
    PolicyInputs,
    PortPolicy,
    compile_ruleset,
    group_set,
    policy_name,
    policy_sets,
    with_ports,
)
from podwire.sgpolicy.rules import DROP, ChainRule
from podwire.sgpolicy.store import PolicyStore

SG = "5e5e5e5e-0000-4000-8000-000000000001"


def _port(sgs: tuple[str, ...] = (SG,), index: int = 1) -> PortPolicy:
    port = DesiredPort(
        f"5e5e5e5e-0000-4000-8000-{index:012d}",
        "5e5e5e5e-0000-4000-8000-0000000000ff",
        f"fa:16:3e:00:00:{index:02x}",
        1450,
        "vxlan",
        None,
        5,
        "veth",
        (FixedIp(f"10.0.0.{index}", "s", "10.0.0.0/24", None),),
        sgs,
    )
    return PortPolicy(port, f"pwp{index:012d}")


def _rule_id(n: int) -> str:
    return f"5e5e5e5e-0000-4000-9000-{n:012d}"


prefixes = st.builds(
    lambda a, n: str(ipaddress.ip_network((a, n), strict=False)),
    st.integers(0, 2**32 - 1),
    st.integers(0, 32),
)
port_ranges = st.tuples(st.integers(1, 200), st.integers(0, 50)).map(lambda t: (t[0], t[0] + t[1]))
rules = st.builds(
    lambda i, proto, ports, prefix: Rule(
        _rule_id(i),
        "ingress",
        "IPv4",
        proto,
        ports[0] if proto in (6, 17) else None,
        ports[1] if proto in (6, 17) else None,
        prefix,
    ),
    st.integers(0, 10**6),
    st.sampled_from([None, 6, 17, 47]),
    port_ranges,
    st.one_of(st.none(), prefixes),
)


def _boxes(elements: frozenset[Element]) -> list[tuple[tuple[int, int], ...]]:
    """Parse the nft text of ``addr . proto . port`` elements back into boxes (what
    libnftables reads is what is checked)."""
    out = []
    for element in (e.text() for e in elements):
        address, proto, port = (part.strip() for part in element.split(" . "))
        if "-" in address:
            low, high = address.split("-")
            span = (int(ipaddress.ip_address(low)), int(ipaddress.ip_address(high)))
        else:
            span = intervals.prefix_span(address)
        out.append((span, _numbers(proto), _numbers(port)))
    return out


def _numbers(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def _admits(rule: Rule, address: int, proto: int, port: int) -> bool:
    span = intervals.prefix_span(rule.remote_ip_prefix or "0.0.0.0/0")
    if not span[0] <= address <= span[1]:
        return False
    if rule.protocol is None:
        return True
    if rule.protocol != proto:
        return False
    return rule.port_min is None or rule.port_min <= port <= (rule.port_max or 0)


@settings(max_examples=150, deadline=None)
@given(st.lists(rules, max_size=12), st.randoms(use_true_random=False))
def test_elements_are_disjoint_and_admit_the_union(chosen: list[Rule], rnd: random.Random) -> None:
    group = SecurityGroup(SG, tuple(chosen))
    compiled = compile_ruleset(PolicyInputs({SG: group}, {}, {}, [_port()]), naming.DEVICES)
    name = policy_name((SG,))
    found = compiled.ruleset.sets.get(("inet", f"{name}_in4"))
    boxes = _boxes(found.elements) if found else []
    for i, first in enumerate(boxes):
        for second in boxes[i + 1 :]:
            assert not all(
                a[0] <= b[1] and b[0] <= a[1] for a, b in zip(first, second, strict=True)
            )
    edges = [
        intervals.prefix_span(r.remote_ip_prefix)[k]
        for r in chosen
        if r.remote_ip_prefix
        for k in (0, 1)
    ]
    for _ in range(60):
        address = rnd.choice(edges) if edges and rnd.random() < 0.5 else rnd.randrange(2**32)
        proto, port = rnd.choice([6, 17, 47, 1]), rnd.randrange(0, 260)
        expected = any(_admits(r, address, proto, port) for r in chosen)
        got = any(
            b[0][0] <= address <= b[0][1]
            and b[1][0] <= proto <= b[1][1]
            and b[2][0] <= port <= b[2][1]
            for b in boxes
        )
        assert got == expected, (address, proto, port)


def test_missing_group_and_remote_group_deny_and_are_reported() -> None:
    other = "5e5e5e5e-0000-4000-8000-000000000002"
    group = SecurityGroup(SG, (Rule(_rule_id(1), "ingress", "IPv4", 6, 22, 22, None, other),))
    compiled = compile_ruleset(
        PolicyInputs({SG: group}, {}, {}, [_port((SG, other))]), naming.DEVICES
    )
    assert any(f"security group {other} is not published yet" in p for p in compiled.problems)
    assert any(f"remote group {other} is not published yet" in p for p in compiled.problems)
    rg = compiled.ruleset.sets[("inet", f"rg4_{other}")]
    assert rg.elements == frozenset()  # the rule naming it matches nothing
    chain = compiled.ruleset.chains[("inet", f"{policy_name(tuple(sorted((SG, other))))}_in")]
    assert chain.rules[-1] == ChainRule(counter=True, verdict=DROP)


def test_change_of_a_ruleset_to_itself_is_empty_and_replace_is_whole() -> None:
    group = SecurityGroup(SG, (Rule(_rule_id(1), "ingress", "IPv4", 6, 22, 22, None),))
    compiled = compile_ruleset(PolicyInputs({SG: group}, {}, {}, [_port()]), naming.DEVICES)
    same = ruleset.change(compiled.ruleset, compiled.ruleset)
    assert same is not None and same.text() == "" and same.elements_only
    text = ruleset.replace(compiled.ruleset)
    assert text.startswith("add table bridge podwire\ndelete table bridge podwire\n")
    assert "flush ruleset" not in text  # only podwire's own tables are touched


def test_port_security_off_is_not_enforced() -> None:
    off = _port()
    off = PortPolicy(
        DesiredPort(**{**off.port.__dict__, "port_security_enabled": False}), off.ifname
    )
    compiled = compile_ruleset(PolicyInputs({}, {}, {}, [off]), naming.DEVICES)
    assert compiled.enforced == 0
    assert compiled.ruleset.sets[("bridge", "ports")].elements == frozenset()


def test_a_port_may_advertise_exactly_the_ipv6_addresses_it_may_send_from() -> None:
    """The ND target sets hold the port's IPv6 sources (link-local, pairs, prefixes) as
    integers, keyed like ``src6``/``src6net``; IPv4 gives none."""
    item = _port()
    pair = AddressPair("fd00:7::/64", "fa:16:3e:00:00:99")
    v6 = FixedIp("fd00:1::5", "s6", "fd00:1::/64", None)
    port = dataclasses.replace(
        item.port, fixed_ips=(*item.port.fixed_ips, v6), allowed_address_pairs=(pair,)
    )
    sets = compile_ruleset(
        PolicyInputs({}, {}, {}, [PortPolicy(port, item.ifname)]), naming.DEVICES
    ).ruleset.sets

    def addresses(name: str) -> set[str]:
        return {e.text().rsplit(" . ", 1)[1] for e in sets[("bridge", name)].elements}

    def integer(address: str) -> str:
        return f"0x{int(ipaddress.IPv6Address(address)):032x}"

    assert addresses("nd6") == {integer(a) for a in addresses("src6")}
    assert addresses("src6") == {"fd00:1::5", "fe80::f816:3eff:fe00:1", "fe80::f816:3eff:fe00:99"}
    net = ipaddress.IPv6Network("fd00:7::/64")
    assert addresses("nd6net") == {
        f"{integer(str(net.network_address))}-{integer(str(net.broadcast_address))}"
    }
    heads = {e.text().rsplit(" . ", 1)[0] for e in sets[("bridge", "nd6net")].elements}
    assert heads == {f'"{item.ifname}" . fa:16:3e:00:00:99'}


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


def _rule_like(draw_value: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": _rule_id(3),
        "direction": "ingress",
        "ethertype": "IPv4",
        "protocol": "tcp",
        "port_range_min": 80,
        "port_range_max": 80,
        "remote_ip_prefix": None,
    }
    return base | draw_value


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "id",
                "direction",
                "ethertype",
                "protocol",
                "port_range_min",
                "port_range_max",
                "remote_ip_prefix",
                "remote_group_id",
            ]
        ),
        junk | st.sampled_from(["udp", "icmp", "ipv6-icmp", "fd00::/64", "10.0.0.1/8", 70000, -1]),
        max_size=3,
    ),
    junk,
)
def test_bad_values_never_raise_and_never_allow(changes: dict[str, Any], garbage: Any) -> None:
    store = PolicyStore()
    good = _rule_like({"id": _rule_id(1), "port_range_min": 22, "port_range_max": 22})
    body = {"v": 1, "id": SG, "rules": [good, _rule_like(changes)]}
    key = f"/podwire/global/secgroups/{SG}"
    store.apply(WatchEvent("put", key, json.dumps(body).encode(), 1))
    store.apply(WatchEvent("put", f"{key}-x/../y", json.dumps(garbage).encode(), 2))
    store.apply(
        WatchEvent("put", "/podwire/global/address_groups/ag", json.dumps(garbage).encode(), 3)
    )
    inputs = store.inputs()
    inputs.ports = [_port()]
    compiled = compile_ruleset(inputs, naming.DEVICES)
    elements = compiled.ruleset.sets[("inet", f"{policy_name((SG,))}_in4")].elements
    assert "0.0.0.0/0 . 6 . 22" in {e.text() for e in elements}  # the good rule stays enforced
    parsed = store.groups[SG].rules
    assert parsed[0].rule_id == _rule_id(1) and len(parsed) in (1, 2)
    if len(parsed) == 1:  # the bad rule was left out, and said so
        assert store.problems[key]
    else:  # it was valid: read with every restriction it states, none dropped
        raw, accepted = _rule_like(changes), parsed[1]
        assert (accepted.rule_id, accepted.direction, accepted.ethertype) == (
            raw["id"],
            raw["direction"],
            raw["ethertype"],
        )
        assert (accepted.port_min, accepted.port_max) == (
            raw.get("port_range_min"),
            raw.get("port_range_max"),
        )
        assert (accepted.protocol is None) == (raw.get("protocol") is None)
        assert (accepted.remote_ip_prefix is None) == (raw.get("remote_ip_prefix") is None)
        assert accepted.remote_group_id == raw.get("remote_group_id")
    # Nothing beyond what the parsed rules say is admitted: the garbage changed no set or chain
    # of the ruleset that exactly those rules compile to.
    alone = PolicyStore()
    alone.apply(WatchEvent("put", key, store.groups[SG].encode().encode(), 1))
    expected = alone.inputs()
    expected.ports = [_port()]
    assert compiled.ruleset == compile_ruleset(expected, naming.DEVICES).ruleset


def test_status_shows_enforcement_per_node() -> None:
    from podwire.schema import nodes
    from podwire.status.nodes import NodeStatus, _apply_state
    from podwire.status.render import _policy_text

    node = NodeStatus("n1")
    assert _policy_text(node) == "not enforced"
    raw = nodes.policy_state_value(12, 345, 2, 1.0)
    _apply_state(node, "policy", None, KeyValue("/podwire/state/nodes/n1/policy", raw, 1, 1, 1, 0))
    assert _policy_text(node) == (
        "12 ports enforced at revision 345, 2 problems (see the agent's log)"
    )
    _apply_state(
        node, "policy", None, KeyValue("/podwire/state/nodes/n1/policy", b"{}", 1, 1, 1, 0)
    )
    assert node.bad_values == 1


def test_a_kept_group_set_keeps_its_chains_and_no_port_maps_to_it() -> None:
    group = SecurityGroup(SG, (Rule("r1", "ingress", "IPv4", 6, 80, 80, "10.0.0.0/8"),))
    without = compile_ruleset(PolicyInputs({SG: group}, {}, {}, []), naming.DEVICES)
    kept = compile_ruleset(PolicyInputs({SG: group}, {}, {}, [], kept=[(SG,)]), naming.DEVICES)
    name = policy_name((SG,))
    assert ("inet", f"{name}_in") not in without.ruleset.chains
    assert ("inet", f"{name}_in") in kept.ruleset.chains
    assert ("inet", f"{name}_in4") in kept.ruleset.sets
    # No port maps to it: nothing in the bridge table names it, so nothing reaches its chains.
    for bridge_set in ("ports", "src_mac"):
        assert not kept.ruleset.sets[("bridge", bridge_set)].elements
    assert kept.enforced == 0
    # With a port of that set, kept or not is the same ruleset.
    port = [_port()]
    assert (
        compile_ruleset(
            PolicyInputs({SG: group}, {}, {}, port, kept=[(SG,)]), naming.DEVICES
        ).ruleset
        == compile_ruleset(PolicyInputs({SG: group}, {}, {}, port), naming.DEVICES).ruleset
    )


GROUPS = [f"5e5e5e5e-0000-4000-8000-{n:012d}" for n in (11, 12, 13)]
numbered = st.integers(1, 40)
port_specs = st.builds(
    lambda index, sgs, secured, pair: (index, tuple(sorted(sgs)), secured, pair),
    numbered,
    st.sets(st.sampled_from(GROUPS), min_size=1, max_size=2),
    st.booleans(),
    st.sampled_from([None, "10.8.0.0/24", "10.8.1.9"]),
)


def _spec_port(index: int, sgs: tuple[str, ...], secured: bool, pair: str | None) -> PortPolicy:
    item = _port(sgs, index)
    pairs = (AddressPair(pair, None),) if pair else ()
    port = DesiredPort(
        **{**item.port.__dict__, "port_security_enabled": secured, "allowed_address_pairs": pairs}
    )
    return PortPolicy(port, item.ifname)


@settings(max_examples=150, deadline=None)
@given(st.lists(port_specs, max_size=8), st.lists(port_specs, max_size=8))
def test_ports_changed_on_their_own_give_what_a_full_compilation_gives(
    before_specs: list[tuple[int, tuple[str, ...], bool, str | None]],
    after_specs: list[tuple[int, tuple[str, ...], bool, str | None]],
) -> None:
    groups = {
        sg: SecurityGroup(sg, (Rule(_rule_id(1), "ingress", "IPv4", 6, 22, 22, None),))
        for sg in GROUPS
    }
    before = list({i: _spec_port(i, *rest) for i, *rest in before_specs}.values())
    after = list({i: _spec_port(i, *rest) for i, *rest in after_specs}.values())
    kept = sorted(policy_sets(before, []) | policy_sets(after, []))  # the same policies
    old = compile_ruleset(PolicyInputs(groups, {}, {}, before, kept=kept), naming.DEVICES)
    full = compile_ruleset(
        PolicyInputs(groups, {}, {}, after, kept=kept, policy_ids=old.policy_ids), naming.DEVICES
    )
    assert full.policy_ids == old.policy_ids
    ids = old.policy_ids
    gone = [p for p in before if p not in after and p.port.port_security_enabled]
    added = [p for p in after if p not in before and p.port.port_security_enabled]
    got = with_ports(
        old.ruleset,
        [(p, ids[group_set(p.port)]) for p in gone],
        [(p, ids[group_set(p.port)]) for p in added],
    )
    assert got == full.ruleset
