"""IPv6 neighbour-discovery spoofing against the compiled ruleset in a real kernel.

A pod (the attacker) writes raw ND frames on its veth; a neighbour pod captures what reaches
it. Port security must pass a port's advertisements (and DAD probes) only for its own
addresses (fixed IPs, allowed address pairs, link-local), pass its ordinary solicitations
(address resolution asks about others' addresses), and drop router advertisements and
redirects: Neutron's firewall semantics (``nd_target`` in its OVS firewall).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podwire.agent import naming
from podwire.netfilter import Nftables
from podwire.schema.ports import AddressPair
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy import ruleset
from podwire.sgpolicy.compile import PolicyInputs, compile_ruleset
from tests.agent.netenv import NetEnv, in_ns
from tests.agent.sgnet import SgHost, SgPod, ping

FRAMES = str(Path(__file__).with_name("ndframes.py"))
OPEN = "0e0e0e0e-0000-4000-8000-0000000000a1"  # everything in and out: the filter is all ports'
PAIR_NET = "fd00:9:0:1::/64"


def _rid(n: int) -> str:
    return f"0e0e0e0e-0000-4000-9000-0000000000a{n}"


@pytest.fixture
def host(netenv: NetEnv) -> Iterator[SgHost]:
    found = SgHost(netenv)
    found.start()
    try:
        yield found
    finally:
        found.stop()


def _link_local(pod: SgPod) -> str:
    out = in_ns(pod.ns, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link").stdout
    return out.split()[3].split("/")[0]


def _send(pod: SgPod, items: list[dict[str, Any]]) -> None:
    in_ns(pod.ns, sys.executable, FRAMES, "send", "eth0", json.dumps(items))


def _captured(observer: SgPod, sender: SgPod, items: list[dict[str, Any]]) -> set[str]:
    """The names of ``items`` that reached ``observer`` when ``sender`` wrote them."""
    argv = ["ip", "netns", "exec", observer.ns, sys.executable, FRAMES, "sniff", "eth0", "2"]
    sniffer = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert sniffer.stdout is not None and sniffer.stdout.readline().strip() == "ready"
    _send(sender, [{k: v for k, v in item.items() if k != "name"} for item in items])
    lines = sniffer.communicate(timeout=10)[0].splitlines()
    seen = [json.loads(line) for line in lines]
    got = set()
    for item in items:
        for frame in seen:
            if frame["eth_src"] == sender.mac and all(
                frame.get(k) == item.get(k) for k in ("kind", "src", "target")
            ):
                got.add(item["name"])
    return got


def _neighbour_mac(pod: SgPod, address: str) -> str:
    out = in_ns(pod.ns, "ip", "-6", "neigh", "show", address, "dev", "eth0").stdout.split()
    return out[out.index("lladdr") + 1] if "lladdr" in out else ""


async def _enforced(host: SgHost) -> Nftables:
    group = SecurityGroup(
        OPEN,
        (
            Rule(_rid(1), "ingress", "IPv6"),
            Rule(_rid(2), "egress", "IPv6"),
            Rule(_rid(3), "egress", "IPv4"),
        ),
    )
    compiled = compile_ruleset(
        PolicyInputs({OPEN: group}, {}, {}, [p.policy() for p in host.pods]), naming.DEVICES
    )
    assert compiled.problems == []
    nft = Nftables(host.ns)
    await nft.apply(ruleset.replace(compiled.ruleset))
    return nft


async def test_a_pod_cannot_advertise_another_pods_address(host: SgHost) -> None:
    """The attack: an NA with Override from the attacker's own link-local address whose
    target is the victim's address would move the victim's traffic to the attacker."""
    attacker = host.pod(1, security_groups=(OPEN,))
    victim = host.pod(2, security_groups=(OPEN,))
    client = host.pod(3, security_groups=(OPEN,))
    nft = await _enforced(host)
    try:
        assert ping(client, victim.ip6)
        assert _neighbour_mac(client, victim.ip6) == victim.mac
        poison = {
            "kind": "na",
            "src": _link_local(attacker),
            "dst": client.ip6,
            "eth_src": attacker.mac,
            "eth_dst": client.mac,
            "target": victim.ip6,
            "lladdr": attacker.mac,
        }
        _send(attacker, [poison])
        assert _neighbour_mac(client, victim.ip6) == victim.mac
        assert ping(client, victim.ip6)
    finally:
        nft.close()


async def test_nd_messages_pass_only_for_the_senders_own_addresses(host: SgHost) -> None:
    pair = AddressPair(PAIR_NET, "fa:16:3e:00:00:01")
    attacker = host.pod(1, security_groups=(OPEN,), pairs=(pair,))
    victim = host.pod(2, security_groups=(OPEN,))
    client = host.pod(3, security_groups=(OPEN,))
    own_ll = _link_local(attacker)
    base = {"eth_src": attacker.mac, "eth_dst": client.mac, "dst": client.ip6}
    dad = {**base, "kind": "ns", "src": "::", "dst": "ff02::1:ff00:1"}

    def na(name: str, src: str, target: str) -> dict[str, Any]:
        return {**base, "name": name, "kind": "na", "src": src, "target": target}

    items = [
        na("na for the victim", own_ll, victim.ip6),
        na("na for the victim's link-local", own_ll, _link_local(victim)),
        na("na for its fixed IP", own_ll, attacker.ip6),
        na("na for its link-local", own_ll, own_ll),
        na("na for an address of its pair's prefix", attacker.ip6, "fd00:9:0:1::55"),
        na("na from the victim's address", victim.ip6, victim.ip6),
        {**dad, "name": "dad for the victim's address", "target": victim.ip6},
        {**dad, "name": "dad for its fixed IP", "target": attacker.ip6},
        {
            **base,
            "name": "ns resolving the victim",
            "kind": "ns",
            "src": own_ll,
            "target": victim.ip6,
            "lladdr": attacker.mac,
        },
        {**base, "name": "router advertisement", "kind": "ra", "src": own_ll},
        {
            **base,
            "name": "redirect",
            "kind": "redirect",
            "src": own_ll,
            "target": own_ll,
            "destination": victim.ip6,
        },
    ]
    # Unfiltered, every frame arrives: what the ruleset drops below is its doing.
    assert _captured(client, attacker, items) == {item["name"] for item in items}
    nft = await _enforced(host)
    try:
        got = _captured(client, attacker, items)
    finally:
        nft.close()
    assert got == {
        "na for its fixed IP",
        "na for its link-local",
        "na for an address of its pair's prefix",
        "dad for its fixed IP",
        "ns resolving the victim",
    }
