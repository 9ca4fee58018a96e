"""Set element changes packed by podwire and sent as one batch, against the real kernel: the
tables end exactly where libnftables' text would have put them, a refused batch changes
nothing, and sets the packer does not know still change (through libnftables, each time told
to the caller, which counts it in ``podwire_agent_policy_element_text_fallbacks``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from podwire.agent import naming
from podwire.netfilter import Nftables, NftError
from podwire.netfilter.elements import Element, ElementChange, IfName, Mac
from podwire.netfilter.nfnl import bodies
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy import ruleset
from podwire.sgpolicy.compile import PolicyInputs, PortPolicy, compile_ruleset
from tests.agent.netenv import NetEnv
from tests.agent.sgnet import nft_shape, numbered_ports

SG = "0e1e0e1e-0000-4000-8000-000000000001"
REMOTE = "0e1e0e1e-0000-4000-8000-000000000002"


def _rid(n: int) -> str:
    return f"0e1e0e1e-0000-4000-9000-{n:012d}"


def _group(first_port: int, remote: bool = False) -> SecurityGroup:
    rules = [
        Rule(_rid(1), "ingress", "IPv4", 6, first_port, first_port + 5, "10.1.0.0/16"),
        Rule(_rid(2), "ingress", "IPv6", 17, 53, 53, "fd00:1::/48"),
        Rule(_rid(3), "ingress", "IPv4", 1, 8, 0, None),  # ICMP echo request
        Rule(_rid(4), "egress", "IPv4"),
    ]
    if remote:
        rules.append(Rule(_rid(5), "ingress", "IPv4", 6, 22, 22, None, REMOTE))
    return SecurityGroup(SG, tuple(rules))


def _inputs(ids: list[int], first_port: int, members: tuple[str, ...] = ()) -> PolicyInputs:
    remote = bool(members)
    groups = {SG: _group(first_port, remote)}
    ports = numbered_ports(max(ids), (SG,))
    return PolicyInputs(
        groups=groups,
        members={REMOTE: {"m": members}} if remote else {},
        ports=[PortPolicy(*ports[i - 1]) for i in ids],
    )


FALLBACKS: list[str] = []  # why ``packed`` sent element changes as text


@pytest.fixture
def two() -> Iterator[tuple[Nftables, Nftables]]:
    env = NetEnv()
    FALLBACKS.clear()
    packed = Nftables(env.namespace("nfa"), on_fallback=FALLBACKS.append)
    text = Nftables(env.namespace("nfb"))
    yield packed, text
    packed.close()
    text.close()
    env.cleanup()


async def _both(two: tuple[Nftables, Nftables], old: PolicyInputs) -> ruleset.Ruleset:
    base = compile_ruleset(old, naming.DEVICES).ruleset
    for nft in two:
        await nft.apply(ruleset.replace(base))
    return base


async def test_pods_and_rules_changed_by_packed_elements_end_where_text_does(
    two: tuple[Nftables, Nftables],
) -> None:
    packed, text = two
    base = await _both(two, _inputs(list(range(1, 21)), 1000))
    # two pods gone, two new, a rule's port range moved: set elements only
    new = compile_ruleset(_inputs([*range(1, 21), 21, 22][2:], 2000), naming.DEVICES).ruleset
    change = ruleset.change(base, new)
    assert change is not None and change.elements_only
    assert {c.set_name for c in change.elements} >= {"ports", "src4", "src6", "src_mac", "nd6"}
    assert any(c.verb == "delete" for c in change.elements)
    for item in change.elements:
        assert bodies(item)  # packed, not handed to libnftables
    await packed.apply_elements(change.elements)
    assert FALLBACKS == []
    await text.apply(change.text())
    listed = [nft_shape(await nft.query("list ruleset")) for nft in two]
    assert listed[0] == listed[1]
    assert '"range": [2000, 2005]' in listed[0] and '"pwp7e5700000021"' in listed[0]


async def test_a_refused_batch_changes_nothing_and_names_the_set(
    two: tuple[Nftables, Nftables],
) -> None:
    packed, _ = two
    base = await _both(two, _inputs([1, 2], 1000))
    before = nft_shape(await packed.query("list ruleset"))
    spec = base.sets[("bridge", "src_mac")].spec
    new = frozenset({Element((IfName("pwpnew"), Mac("fa:16:3e:00:00:01")))})
    absent = frozenset({Element((IfName("pwpnone"), Mac("fa:16:3e:00:00:02")))})
    good = ElementChange("bridge", "podwire", "src_mac", spec, "add", new)
    gone = ElementChange("bridge", "podwire", "src_mac", spec, "delete", absent)
    for batch in ([good, gone], [gone, good]):  # the refused one last, then first
        with pytest.raises(NftError, match="delete element bridge podwire src_mac"):
            await packed.apply_elements(batch)
        assert nft_shape(await packed.query("list ruleset")) == before


async def test_remote_group_intervals_are_packed_and_end_where_text_does(
    two: tuple[Nftables, Nftables],
) -> None:
    """One-field interval sets (a remote group's members): members added next to, between
    and after others, one removed, the last address of the family, all in packed batches."""
    packed, text = two
    steps = [
        ("10.1.0.7",),
        ("10.1.0.7", "10.1.0.9"),
        ("10.1.0.7", "10.1.0.8", "10.1.0.9", "10.1.0.20"),  # merged into one range
        ("10.1.0.9", "10.1.0.20", "255.255.255.255"),  # a range split, the last address
        ("10.1.0.20",),
    ]
    base = await _both(two, _inputs([1, 2], 1000, steps[0]))
    for members in steps[1:]:
        new = compile_ruleset(_inputs([1, 2], 1000, members), naming.DEVICES).ruleset
        change = ruleset.change(base, new)
        assert change is not None and change.elements_only
        assert {c.set_name for c in change.elements} == {f"rg4_{REMOTE}"}
        await packed.apply_elements(change.elements)
        await text.apply(change.text())
        listed = [nft_shape(await nft.query("list ruleset")) for nft in two]
        assert listed[0] == listed[1], members
        base = new
    assert FALLBACKS == []
    assert "10.1.0.20" in listed[0] and "10.1.0.9" not in listed[0]


async def test_sets_the_packer_does_not_know_change_through_libnftables(
    two: tuple[Nftables, Nftables],
) -> None:
    packed, text = two
    await _both(two, _inputs([1, 2], 1000))
    spec = "type ether_addr; flags interval;"  # no set of podwire's: a MAC range
    for nft in two:
        await nft.apply(f"add set bridge podwire extra {{ {spec} }}")
    mac = frozenset({Element((Mac("fa:16:3e:00:00:01"),))})
    change = ElementChange("bridge", "podwire", "extra", spec, "add", mac)
    await packed.apply_elements([change])
    assert len(FALLBACKS) == 1 and "set declaration" in FALLBACKS[0]  # counted, not silent
    await text.apply(change.text())
    listed = [nft_shape(await nft.query("list ruleset")) for nft in two]
    assert listed[0] == listed[1] and "fa:16:3e:00:00:01" in listed[0]
