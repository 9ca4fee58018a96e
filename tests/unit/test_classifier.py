"""The memif classifier's compilation, wire encoding and strict reader (#38): a port's policy
round-trips through its bytes, a policy over a limit is refused naming the limit, and every
kind of malformed blob is refused naming what is wrong."""

from __future__ import annotations

import struct

import pytest

from podwire.schema.ports import AddressPair, DesiredPort, FixedIp
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy import classifier
from podwire.sgpolicy.classifier import (
    HEADER,
    MAX_RULES,
    UNFILTERED,
    Classifier,
    ClassifierRule,
    ClassifierTooLarge,
    MalformedClassifier,
    PrefixList,
    RuleKind,
    compile_classifier,
    decode,
    encode,
)
from podwire.sgpolicy.compile import PolicyInputs, PortPolicy

SG = "5e5e5e5e-0000-4000-8000-000000000001"
PEERS = "5e5e5e5e-0000-4000-8000-000000000002"
AG = "5e5e5e5e-0000-4000-8000-000000000003"
MAC = "fa:16:3e:00:00:01"


def _rid(n: int) -> str:
    return f"5e5e5e5e-0000-4000-9000-{n:012d}"


def _port(security: bool = True, pairs: tuple[AddressPair, ...] = ()) -> DesiredPort:
    return DesiredPort(
        "5e5e5e5e-0000-4000-8000-0000000000aa",
        "5e5e5e5e-0000-4000-8000-0000000000bb",
        MAC,
        1500,
        "vxlan",
        None,
        100,
        "vhostuser",
        (FixedIp("10.9.0.1", "s4", "10.9.0.0/24", None), FixedIp("fd00:9::1", "s6", "", None)),
        (SG,),
        port_security_enabled=security,
        allowed_address_pairs=pairs,
    )


RULES = (
    Rule(_rid(1), "ingress", "IPv4", 6, 80, 90, "10.0.0.0/8"),
    Rule(_rid(2), "ingress", "IPv4", 1, 8, None, None),
    Rule(_rid(3), "ingress", "IPv6", 58, 128, 0, None, PEERS),
    Rule(_rid(4), "ingress", "IPv4", 17, 53, 53, None, None, AG),
    Rule(_rid(5), "egress", "IPv4"),
    Rule(_rid(6), "egress", "IPv6", 253),
    Rule(_rid(7), "ingress", "IPv4", 6, 80, 90, "10.0.0.0/8"),  # a repeat: one record
)


def _inputs(*groups: SecurityGroup) -> PolicyInputs:
    port = _port(pairs=(AddressPair("192.168.0.0/24", "fa:16:3e:00:00:02"),))
    return PolicyInputs(
        {g.sg_id: g for g in groups},
        {PEERS: {"m1": ("fd00:9::5/128", "10.9.0.5/32"), "m2": ("fd00:9::6/128",)}},
        {AG: ("10.1.0.0/16", "10.2.0.0/16")},
        [PortPolicy(port, "pwtest0")],
    )


def _compiled(stateful: bool = True) -> Classifier:
    inputs = _inputs(SecurityGroup(SG, RULES, stateful=stateful))
    return compile_classifier(inputs, inputs.ports[0].port)


def test_compiles_rules_remote_groups_and_port_facts() -> None:
    found = _compiled()
    assert found.filtered and found.stateful
    assert found.macs == ("fa:16:3e:00:00:01", "fa:16:3e:00:00:02")
    v4 = [(s.mac, s.span) for s in found.sources if s.version == 4]
    assert (MAC, (0x0A090001, 0x0A090001)) in v4
    assert ("fa:16:3e:00:00:02", (0xC0A80000, 0xC0A800FF)) in v4  # the pair, its own MAC
    assert len([s for s in found.sources if s.version == 6]) == 3  # fixed IP, 2 link-locals
    ingress = found.ingress
    assert len(ingress) == 4 and len(found.egress) == 2
    assert ingress[0] == ClassifierRule(4, RuleKind.PORTS, (6, 6), (80, 90), 0)
    assert found.lists[0] == PrefixList(4, ((0x0A000000, 0x0AFFFFFF),))
    assert ingress[1].kind == RuleKind.ICMP and ingress[1].first == (8, 8)
    assert ingress[1].second == (0, 255)
    group = found.lists[ingress[2].prefixes]  # the members' IPv6 addresses only
    assert group.version == 6 and len(group.spans) == 1  # ::5 and ::6 merged
    assert found.lists[ingress[3].prefixes].spans == ((0x0A010000, 0x0A02FFFF),)
    assert found.egress[1] == ClassifierRule(6, RuleKind.PORTS, (253, 253), (0, 65535), 4)


def test_port_security_off_and_stateless() -> None:
    inputs = _inputs(SecurityGroup(SG, RULES))
    assert compile_classifier(inputs, _port(security=False)) == UNFILTERED
    assert decode(encode(UNFILTERED)) == UNFILTERED
    assert not _compiled(stateful=False).stateful


@pytest.mark.parametrize("stateful", [True, False])
def test_round_trip(stateful: bool) -> None:
    found = _compiled(stateful)
    blob = encode(found)
    assert decode(blob) == found
    n_spans = sum(len(p.spans) for p in found.lists)
    records = (8 * 2, 40 * len(found.sources), 16 * len(found.lists), 32 * n_spans)
    assert len(blob) == HEADER.size + sum(records) + 16 * 6


def test_over_a_limit_is_refused_naming_it() -> None:
    many = tuple(Rule(_rid(100 + i), "ingress", "IPv4", 6, i, i, None) for i in range(1, 2100))
    inputs = _inputs(SecurityGroup(SG, many))
    with pytest.raises(ClassifierTooLarge, match=f"MAX_RULES = {MAX_RULES}"):
        compile_classifier(inputs, inputs.ports[0].port)
    found = _compiled()
    wide = Classifier(True, True, found.macs, found.sources, found.lists, found.ingress * 600, ())
    with pytest.raises(ClassifierTooLarge, match="MAX_RULES"):
        encode(wide)


def _patched(blob: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(blob)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _offsets(found: Classifier) -> dict[str, int]:
    macs = HEADER.size
    sources = macs + 8 * len(found.macs)
    lists = sources + 40 * len(found.sources)
    spans = lists + 16 * len(found.lists)
    rules = spans + 32 * sum(len(p.spans) for p in found.lists)
    return {"macs": macs, "sources": sources, "lists": lists, "spans": spans, "rules": rules}


def test_malformed_blobs_are_refused_naming_the_problem() -> None:
    found = _compiled()
    blob = encode(found)
    at = _offsets(found)
    size = len(blob)
    last = at["lists"] + 16 * (len(found.lists) - 1)
    cases = {
        "20 bytes: not within the header's 32": blob[:20],
        "magic": b"XXXX" + blob[4:],
        "format version 2": _patched(blob, 4, "<H", 2),
        "header size": _patched(blob, 6, "<H", 40),
        "unknown flags": _patched(blob, 8, "<H", 0x4),
        "over MAX_MACS": _patched(blob, 10, "<H", 33),
        "its counts make": blob + bytes(16),
        "header says": _patched(blob, 24, "<I", size + 1),
        "header: reserved": _patched(blob, 28, "<I", 1),
        "zero or multicast": _patched(blob, at["macs"], "<B", 0x01),
        "MACs not sorted": blob[: at["macs"]]
        + blob[at["macs"] + 8 : at["macs"] + 16]
        + blob[at["macs"] : at["macs"] + 8]
        + blob[at["macs"] + 16 :],
        "MAC record at offset 32: reserved": _patched(blob, at["macs"] + 6, "<B", 1),
        "MAC index 7": _patched(blob, at["sources"], "<B", 7),
        "source: IP version 5": _patched(blob, at["sources"] + 1, "<B", 5),
        "address above the IPv4 range": _patched(blob, at["sources"] + 8, "<B", 1),
        "span ends before it starts": _patched(blob, at["sources"] + 8 + 15, "<B", 0xFF),
        "prefix list 0: starts at span 1": _patched(blob, at["lists"], "<I", 1),
        "past": _patched(blob, at["lists"] + 4, "<I", 99),
        "do not cover": _patched(blob, last + 4, "<I", len(found.lists[-1].spans) - 1),
        "rule: kind 3": _patched(blob, at["rules"] + 1, "<B", 3),
        "rule: range 90-80": _patched(
            _patched(blob, at["rules"] + 6, "<H", 90), at["rules"] + 8, "<H", 80
        ),
        "rule: prefix list 99": _patched(blob, at["rules"] + 10, "<H", 99),
        "is not an IPv4 list": _patched(blob, at["rules"] + 10, "<H", 2),
    }
    for needle, bad in cases.items():
        with pytest.raises(MalformedClassifier, match=needle.replace("(", r"\(")):
            decode(bad)
    unfiltered = _patched(blob, 8, "<H", 0)
    with pytest.raises(MalformedClassifier, match="unfiltered classifier carries"):
        decode(unfiltered)


def test_the_largest_blob_is_bounded() -> None:
    assert classifier.MAX_SIZE < 1 << 20
    with pytest.raises(MalformedClassifier, match="MAX_SIZE"):
        decode(bytes(classifier.MAX_SIZE + 1))
