"""A port's security groups and port security as a classifier the memif master applies frame
by frame: the second rendering of the policy ``compile`` renders to nftables (#38).

The same inputs (``PolicyInputs``, the port's ``DesiredPort``) go through the same expansion
(``compile.rule_boxes`` for rules, ``compile.remote_addresses`` / ``address_spans`` for remote
groups and address groups, ``compile.source_spans`` for anti-spoofing), so the classifier admits
what the port's nftables chains admit; a differential test holds the two to that
(tests/agent/test_classifier_differential.py). What each record means, and what the master
does with a frame, is in docs/memif.md ("Security groups in the master").

The encoding is fixed-size little-endian records (addresses as 16 bytes in network order) with
hard limits, so the C side reads it without a parser library; ``decode`` is the strict reader
it mirrors: anything not in canonical form is refused, naming what is wrong.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from enum import IntEnum

from podwire.errors import PermanentError, ValidationError
from podwire.schema.ports import DesiredPort
from podwire.schema.secgroups import EGRESS, INGRESS, Rule
from podwire.sgpolicy import intervals
from podwire.sgpolicy.compile import (
    PolicyInputs,
    address_spans,
    policy_stateful,
    port_groups,
    remote_addresses,
    rule_boxes,
    source_spans,
)

MAGIC = b"PWCL"
FORMAT_VERSION = 1
FILTERED = 0x1  # header flags: port security on (else every frame is admitted)
STATEFUL = 0x2  # every group of the port is stateful: replies to admitted flows pass
MAX_MACS = 32
MAX_SOURCES = 256
MAX_LISTS = 1024
MAX_SPANS = 16384
MAX_RULES = 2048  # per direction
LIMITS = {
    "MAX_MACS": MAX_MACS,
    "MAX_SOURCES": MAX_SOURCES,
    "MAX_LISTS": MAX_LISTS,
    "MAX_SPANS": MAX_SPANS,
    "MAX_RULES": MAX_RULES,
}
TOP = {4: 2**32 - 1, 6: 2**128 - 1}

HEADER = struct.Struct("<4s10HI4x")  # 32 bytes
MAC_RECORD = struct.Struct("<6s2x")  # 8
SOURCE_RECORD = struct.Struct("<BB6x16s16s")  # 40
LIST_RECORD = struct.Struct("<IIB7x")  # 16
SPAN_RECORD = struct.Struct("<16s16s")  # 32
RULE_RECORD = struct.Struct("<BB5H4x")  # 16
MAX_SIZE = (
    HEADER.size
    + MAX_MACS * MAC_RECORD.size
    + MAX_SOURCES * SOURCE_RECORD.size
    + MAX_LISTS * LIST_RECORD.size
    + MAX_SPANS * SPAN_RECORD.size
    + 2 * MAX_RULES * RULE_RECORD.size
)

Span = intervals.Span


class RuleKind(IntEnum):
    """What a rule's two ranges are."""

    PORTS = 1  # IP protocol, then the transport header's destination port
    ICMP = 2  # ICMP (IPv4) or ICMPv6 (IPv6) type, then code


@dataclass(frozen=True)
class ClassifierRule:
    """An allow: the frame's IP version is ``version``, its (protocol, port) or (ICMP type,
    code) fall in ``first`` and ``second``, and its remote address (the source for ingress,
    the destination for egress) is in prefix list ``prefixes``."""

    version: int
    kind: RuleKind
    first: Span
    second: Span
    prefixes: int


@dataclass(frozen=True)
class PrefixList:
    """Addresses of one IP version as sorted, disjoint, non-adjacent spans: a rule's remote
    prefix, or the members of a remote group or an address group."""

    version: int
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class SourceSpan:
    """The port may send from ``mac`` with a source address in ``span`` (its fixed IPs,
    allowed address pairs, link-local addresses)."""

    mac: str
    version: int
    span: Span


@dataclass(frozen=True)
class Classifier:
    filtered: bool
    stateful: bool
    macs: tuple[str, ...]  # sorted, lower case
    sources: tuple[SourceSpan, ...]  # sorted by MAC, version, address
    lists: tuple[PrefixList, ...]
    ingress: tuple[ClassifierRule, ...]
    egress: tuple[ClassifierRule, ...]


UNFILTERED = Classifier(False, False, (), (), (), (), ())


class ClassifierTooLarge(PermanentError):
    """A port's policy does not fit the classifier's limits (the port keeps the kernel path)."""


class MalformedClassifier(ValidationError):
    """A classifier blob the strict reader refuses; the message names the problem."""


# -- compiling --------------------------------------------------------------------------


def compile_classifier(inputs: PolicyInputs, port: DesiredPort) -> Classifier:
    """The classifier of one port. Raises ``ClassifierTooLarge`` past a limit."""
    if not port.filtered:
        return UNFILTERED
    groups = port_groups(inputs, port)
    macs, spans = source_spans(port)
    sources = tuple(
        SourceSpan(mac.lower(), version, span)
        for (mac, version), found in sorted(spans.items(), key=lambda item: item[0])
        for span in found
    )
    lists: dict[PrefixList, int] = {}
    rules = [rule for group in groups for rule in group.rules]
    ingress = _rules(inputs, [r for r in rules if r.direction == INGRESS], lists)
    egress = _rules(inputs, [r for r in rules if r.direction == EGRESS], lists)
    found = Classifier(
        True,
        policy_stateful(groups),
        tuple(sorted(mac.lower() for mac in macs)),
        tuple(sorted(sources, key=lambda s: (s.mac, s.version, s.span))),
        tuple(lists),
        ingress,
        egress,
    )
    check_limits(found, port.port_id)
    return found


def _rules(
    inputs: PolicyInputs, rules: list[Rule], lists: dict[PrefixList, int]
) -> tuple[ClassifierRule, ...]:
    out: dict[ClassifierRule, None] = {}  # ordered, without repeats
    for rule in rules:
        version = 4 if rule.ethertype == "IPv4" else 6
        ports, icmp = rule_boxes([rule], version)
        for kind, boxes in ((RuleKind.PORTS, ports), (RuleKind.ICMP, icmp)):
            for dims, address in boxes:
                if rule.remote_group_id:
                    addresses, _ = remote_addresses(inputs, "g", rule.remote_group_id)
                    spans = tuple(address_spans(addresses, version))
                elif rule.remote_address_group_id:
                    addresses, _ = remote_addresses(inputs, "a", rule.remote_address_group_id)
                    spans = tuple(address_spans(addresses, version))
                else:
                    spans = (address,)
                index = lists.setdefault(PrefixList(version, spans), len(lists))
                out[ClassifierRule(version, kind, dims[0], dims[1], index)] = None
    return tuple(out)


def check_limits(found: Classifier, what: str) -> None:
    counts = {
        "MAX_MACS": len(found.macs),
        "MAX_SOURCES": len(found.sources),
        "MAX_LISTS": len(found.lists),
        "MAX_SPANS": sum(len(p.spans) for p in found.lists),
        "MAX_RULES": max(len(found.ingress), len(found.egress)),
    }
    for name, count in counts.items():
        if count > LIMITS[name]:
            raise ClassifierTooLarge(
                f"{what}: {count} is over the classifier's {name} = {LIMITS[name]}"
            )


# -- the wire encoding ------------------------------------------------------------------


def encode(found: Classifier) -> bytes:
    """The blob the master is handed; raises ``ClassifierTooLarge`` past a limit."""
    check_limits(found, "classifier")
    flags = (FILTERED if found.filtered else 0) | (STATEFUL if found.stateful else 0)
    spans = [span for prefix in found.lists for span in prefix.spans]
    counts = (
        len(found.macs),
        len(found.sources),
        len(found.lists),
        len(spans),
        len(found.ingress),
        len(found.egress),
    )
    parts = [b""]
    parts += [MAC_RECORD.pack(bytes.fromhex(mac.replace(":", ""))) for mac in found.macs]
    index = {mac: i for i, mac in enumerate(found.macs)}
    parts += [
        SOURCE_RECORD.pack(index[s.mac], s.version, *_address_pair(s.span)) for s in found.sources
    ]
    first = 0
    for prefix in found.lists:
        parts.append(LIST_RECORD.pack(first, len(prefix.spans), prefix.version))
        first += len(prefix.spans)
    parts += [SPAN_RECORD.pack(*_address_pair(span)) for span in spans]
    for rule in (*found.ingress, *found.egress):
        parts.append(
            RULE_RECORD.pack(rule.version, rule.kind, *rule.first, *rule.second, rule.prefixes)
        )
    size = HEADER.size + sum(len(part) for part in parts)
    parts[0] = HEADER.pack(MAGIC, FORMAT_VERSION, HEADER.size, flags, *counts, 0, size)
    return b"".join(parts)


def _address_pair(span: Span) -> tuple[bytes, bytes]:
    return span[0].to_bytes(16, "big"), span[1].to_bytes(16, "big")


def decode(blob: bytes) -> Classifier:
    """The strict reader: raises ``MalformedClassifier`` naming the first problem found."""
    flags, counts = _header(blob)
    n_macs, n_sources, n_lists, n_spans, n_in, n_out = counts
    filtered = bool(flags & FILTERED)
    reader = _Reader(blob, HEADER.size)
    macs = tuple(_mac(reader.next(MAC_RECORD, "MAC")[0]) for _ in range(n_macs))
    _ascending(macs, "MACs")
    if filtered and not macs:
        raise MalformedClassifier("a filtered classifier without a MAC")
    sources = tuple(_source(reader, macs) for _ in range(n_sources))
    _canonical_sources(sources)
    heads = [reader.next(LIST_RECORD, "prefix list") for _ in range(n_lists)]
    spans = [reader.next(SPAN_RECORD, "span") for _ in range(n_spans)]
    lists: list[PrefixList] = []
    covered = 0
    for index, head in enumerate(heads):
        lists.append(_prefix_list(index, head, spans, covered))
        covered += len(lists[-1].spans)
    if covered != n_spans:
        raise MalformedClassifier(f"the prefix lists do not cover all {n_spans} spans")
    ingress = tuple(_rule(reader, lists) for _ in range(n_in))
    egress = tuple(_rule(reader, lists) for _ in range(n_out))
    return Classifier(
        filtered, bool(flags & STATEFUL), macs, sources, tuple(lists), ingress, egress
    )


def _header(blob: bytes) -> tuple[int, tuple[int, ...]]:
    """The header's flags and record counts, checked against the blob's length."""
    if not HEADER.size <= len(blob) <= MAX_SIZE:
        raise MalformedClassifier(
            f"{len(blob)} bytes: not within the header's {HEADER.size} and MAX_SIZE = {MAX_SIZE}"
        )
    magic, version, header_size, flags, *counts, reserved, size = HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise MalformedClassifier(f"magic {magic!r} is not {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise MalformedClassifier(f"format version {version}: this reader knows {FORMAT_VERSION}")
    if header_size != HEADER.size:
        raise MalformedClassifier(f"header size {header_size} is not {HEADER.size}")
    if reserved or blob[28:32] != bytes(4):
        raise MalformedClassifier("header: reserved bytes not zero")
    if flags & ~(FILTERED | STATEFUL):
        raise MalformedClassifier(f"unknown flags {flags:#x}")
    names = ("MAX_MACS", "MAX_SOURCES", "MAX_LISTS", "MAX_SPANS", "MAX_RULES", "MAX_RULES")
    for name, count in zip(names, counts, strict=True):
        if count > LIMITS[name]:
            raise MalformedClassifier(f"{count} records: over {name} = {LIMITS[name]}")
    records = (MAC_RECORD, SOURCE_RECORD, LIST_RECORD, SPAN_RECORD, RULE_RECORD, RULE_RECORD)
    expected = HEADER.size + sum(r.size * n for r, n in zip(records, counts, strict=True))
    if size != expected or len(blob) != expected:
        raise MalformedClassifier(
            f"{len(blob)} bytes, header says {size}, its counts make {expected}"
        )
    if not flags & FILTERED and (flags or any(counts)):
        raise MalformedClassifier("an unfiltered classifier carries flags or records")
    return flags, tuple(counts)


class _Reader:
    def __init__(self, blob: bytes, offset: int) -> None:
        self.blob = blob
        self.offset = offset

    def next(self, record: struct.Struct, what: str) -> tuple[int | bytes, ...]:
        at = self.offset
        values: tuple[int | bytes, ...] = record.unpack_from(self.blob, at)
        self.offset += record.size
        # Every record's padding is zero: pack it again and compare.
        if record.pack(*values) != self.blob[at : self.offset]:
            raise MalformedClassifier(f"{what} record at offset {at}: reserved bytes not zero")
        return values


def _mac(raw: int | bytes) -> str:
    assert isinstance(raw, bytes)
    if raw == bytes(6) or raw[0] & 1:
        raise MalformedClassifier(f"MAC {raw.hex(':')} is zero or multicast")
    return raw.hex(":")


def _ascending(values: tuple[str, ...], what: str) -> None:
    if any(a >= b for a, b in itertools.pairwise(values)):
        raise MalformedClassifier(f"{what} not sorted ascending without repeats")


def _address(raw: int | bytes, version: int, what: str) -> int:
    assert isinstance(raw, bytes)
    value = int.from_bytes(raw, "big")
    if value > TOP[version]:
        raise MalformedClassifier(f"{what}: address above the IPv{version} range")
    return value


def _span(low: int | bytes, high: int | bytes, version: int, what: str) -> Span:
    span = (_address(low, version, what), _address(high, version, what))
    if span[0] > span[1]:
        raise MalformedClassifier(f"{what}: span ends before it starts")
    return span


def _version(value: int | bytes, what: str) -> int:
    if value not in (4, 6):
        raise MalformedClassifier(f"{what}: IP version {value!r} is not 4 or 6")
    return _int(value)


def _source(reader: _Reader, macs: tuple[str, ...]) -> SourceSpan:
    raw_index, version, low, high = reader.next(SOURCE_RECORD, "source")
    index = _int(raw_index)
    if index >= len(macs):
        raise MalformedClassifier(f"source: MAC index {index} with {len(macs)} MACs")
    found = _version(version, "source")
    return SourceSpan(macs[index], found, _span(low, high, found, "source"))


def _canonical_sources(sources: tuple[SourceSpan, ...]) -> None:
    for before, after in itertools.pairwise(sources):
        same = (before.mac, before.version) == (after.mac, after.version)
        if (before.mac, before.version) > (after.mac, after.version) or (
            same and after.span[0] <= before.span[1] + 1
        ):
            raise MalformedClassifier("sources not sorted, or overlapping or adjacent")


def _prefix_list(
    index: int, head: tuple[int | bytes, ...], spans: list[tuple[int | bytes, ...]], at: int
) -> PrefixList:
    """The lists tile the span table in order: list ``index`` starts at span ``at``."""
    first, count = _int(head[0]), _int(head[1])
    what = f"prefix list {index}"
    version = _version(head[2], what)
    if first != at:
        raise MalformedClassifier(f"{what}: starts at span {first}, not {at} (lists tile spans)")
    if first + count > len(spans):
        raise MalformedClassifier(f"{what}: spans {first}..{first + count} past {len(spans)}")
    found = tuple(
        _span(spans[i][0], spans[i][1], version, what) for i in range(first, first + count)
    )
    for before, after in itertools.pairwise(found):
        if after[0] <= before[1] + 1:
            raise MalformedClassifier(f"{what}: spans not sorted, or overlapping or adjacent")
    return PrefixList(version, found)


def _int(value: int | bytes) -> int:
    assert isinstance(value, int)
    return value


def _rule(reader: _Reader, lists: list[PrefixList]) -> ClassifierRule:
    raw = reader.next(RULE_RECORD, "rule")
    version, kind, prefixes = _version(raw[0], "rule"), _int(raw[1]), _int(raw[6])
    if kind not in (RuleKind.PORTS, RuleKind.ICMP):
        raise MalformedClassifier(f"rule: kind {kind} is not {RuleKind.PORTS} or {RuleKind.ICMP}")
    first, second = (_int(raw[2]), _int(raw[3])), (_int(raw[4]), _int(raw[5]))
    bounds = (255, 65535) if kind == RuleKind.PORTS else (255, 255)
    for (low, high), top in zip((first, second), bounds, strict=True):
        if not low <= high <= top:
            raise MalformedClassifier(f"rule: range {low}-{high} is not within 0-{top}")
    if prefixes >= len(lists) or lists[prefixes].version != version:
        raise MalformedClassifier(f"rule: prefix list {prefixes} is not an IPv{version} list")
    return ClassifierRule(version, RuleKind(kind), first, second, prefixes)
