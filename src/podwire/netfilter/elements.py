"""Set elements as typed values, and their nf_tables netlink encoding.

The compiler builds each element from typed fields (``IfName``, ``Mac``, ``Addresses``,
``Numbers``, ``Jump``); nft's text and the kernel's bytes are both rendered from them, so
nothing is ever written as text and parsed back.

A pod's ADD or DEL changes nothing in podwire's tables but the elements of a few sets (its
interface, MAC and addresses, its policy verdicts). Through libnftables each such change costs
a parse and a dump of every table, chain and set before the one batch goes out (~0.8 ms here
on a cold CPU); packed here, the same batch is a few hundred bytes built in microseconds. The
kernel does the same work either way, and the batch is one transaction just the same.

Only what podwire's sets hold is encoded: interface names, MACs, IPv4/IPv6 addresses, marks,
protocols, ports, ICMP types and codes, ND targets (a ``typeof`` key of a raw payload) and
verdicts. Intervals of a concatenation are one element with a closing key; a one-field interval
set (remote-group members) stores each range as two elements, as libnftables sends them: its
first value, and the value after its last flagged as an interval's end (none when the range
reaches the type's last value). Anything else raises ``Unencodable`` and goes through
libnftables.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import ClassVar

from podwire.errors import PermanentError

NFT_JUMP = -3
IFNAMSIZ = 16


class Unencodable(PermanentError):
    """A set or element this encoder does not know how to pack: libnftables applies it."""


@dataclass(frozen=True)
class ElementChange:
    """Elements added to or deleted from one set; ``spec`` is the set's declaration body
    (``type ifname . ether_addr; flags interval;``), which says how its elements are packed."""

    family: str
    table: str
    set_name: str
    spec: str
    verb: str  # "add" or "delete"
    elements: frozenset[Element]

    def text(self) -> str:
        # Sorted, so equal changes give equal buffers (tests and logs compare them).
        listed = ", ".join(sorted(element.text() for element in self.elements))
        return f"{self.verb} element {self.family} {self.table} {self.set_name} {{ {listed} }}"


@dataclass(frozen=True)
class Packed:
    """One element in kernel form: key, closing key (concatenated intervals), map data."""

    key: bytes
    key_end: bytes | None = None
    value: bytes | None = None  # a map's data value
    verdict: tuple[int, str] | None = None  # a verdict map's (code, chain)
    interval_end: bool = False  # a one-field interval set's closing element


@dataclass(frozen=True)
class _Layout:
    key: tuple[str, ...]
    data: str | None
    interval: bool


# The expressions a ``typeof`` declaration may name, as the type each one loads.
_TYPEOF = {"iifname": "ifname", "ether saddr": "ether_addr", "@th,64,128": "integer128"}


def layout(spec: str) -> _Layout:
    """The key types, data type and interval flag of a set declaration body."""
    parts = [part.strip() for part in spec.split(";") if part.strip()]
    declared = [p for p in parts if p.startswith(("type ", "typeof "))]
    flags = [p for p in parts if p.startswith("flags ")]
    others = [p for p in parts if not p.startswith(("type ", "typeof ", "flags "))]
    if len(declared) != 1 or others:
        raise Unencodable(f"set declaration {spec!r}")
    if declared[0].startswith("typeof "):
        typed = _typeof(declared[0].removeprefix("typeof "), spec)
    else:
        typed = declared[0].removeprefix("type ")
    key_text, _, data = typed.partition(" : ")
    key = tuple(t.strip() for t in key_text.split(" . "))
    interval = any("interval" in f for f in flags)
    if any(f.replace(",", " ").split()[1:] != ["interval"] for f in flags):
        raise Unencodable(f"set flags in {spec!r}")
    for kind in (*key, data or "mark"):
        if kind not in _WIDTH and kind != "verdict":
            raise Unencodable(f"type {kind!r} in {spec!r}")
    if "verdict" in key:
        raise Unencodable(f"set declaration {spec!r}")
    if interval and len(key) == 1 and (key[0] not in _BIG_ENDIAN or data):
        raise Unencodable(f"set declaration {spec!r}")
    return _Layout(key, data.strip() or None, interval)


def _typeof(expressions: str, spec: str) -> str:
    """A ``typeof`` key as the types it loads (only the expressions podwire's sets use)."""
    if " : " in expressions:
        raise Unencodable(f"set declaration {spec!r}")
    kinds = [_TYPEOF.get(e.strip()) for e in expressions.split(" . ")]
    if None in kinds:
        raise Unencodable(f"set declaration {spec!r}")
    return " . ".join(k for k in kinds if k)


def pack_all(item: _Layout, element: Element) -> list[Packed]:
    """The kernel elements of one element: one, or a one-field interval's two."""
    _check_kinds(item, element)
    if not (item.interval and len(item.key) == 1):
        return [_pack(item, element)]
    low, high = element.key[0].span()
    start = Packed(_padded(low))
    following = int.from_bytes(high, "big") + 1
    if following >> (8 * len(high)):  # the range reaches the last value: no closing element
        return [start]
    return [start, Packed(_padded(following.to_bytes(len(high), "big")), interval_end=True)]


def pack(item: _Layout, element: Element) -> Packed:
    """One element of a set that is not a one-field interval set (``pack_all`` takes both)."""
    _check_kinds(item, element)
    if item.interval and len(item.key) == 1:
        raise Unencodable(f"element {element.text()!r} of a one-field interval set")
    return _pack(item, element)


def _pack(item: _Layout, element: Element) -> Packed:
    """``pack`` once the element's fields are known to match the set's."""
    starts, ends = [], []
    for field in element.key:
        start, end = field.span()
        if start != end and not item.interval:
            raise Unencodable(f"range {field.text()!r} in a set without intervals")
        starts.append(_padded(start))
        ends.append(_padded(end))
    key, key_end = b"".join(starts), b"".join(ends)
    closing = key_end if item.interval else None
    data = element.data
    if isinstance(data, Jump):
        return Packed(key, closing, verdict=(NFT_JUMP, data.chain))
    if data is not None:
        value, _ = data.span()
        return Packed(key, closing, value=value)
    return Packed(key, closing)


def _check_kinds(item: _Layout, element: Element) -> None:
    """The element's fields are of the types the set declares, in its order."""
    kinds = tuple(field.kind for field in element.key)
    data = element.data.kind if element.data is not None else None
    if kinds != item.key or data != item.data:
        raise Unencodable(f"element {element.text()!r} for {' . '.join(item.key)}")


_WIDTH = {
    "ifname": IFNAMSIZ,
    "ether_addr": 6,
    "ipv4_addr": 4,
    "ipv6_addr": 16,
    "mark": 4,
    "inet_proto": 1,
    "inet_service": 2,
    "icmp_type": 1,
    "icmp_code": 1,
    "icmpv6_type": 1,
    "icmpv6_code": 1,
    "integer128": 16,  # a raw 128-bit payload (an ND target), big-endian as loaded
}
# The types loaded in network byte order: a range of them is a range of big-endian numbers.
_BIG_ENDIAN = frozenset(_WIDTH) - {"ifname", "ether_addr", "mark"}


def _padded(data: bytes) -> bytes:
    """Each field of a concatenation takes whole 32-bit registers."""
    return data + b"\0" * (-len(data) % 4)


# -- elements as typed values ---------------------------------------------------------


@dataclass(frozen=True, order=True)
class IfName:
    """An interface name, as an ``ifname`` key matches it."""

    name: str
    kind: ClassVar[str] = "ifname"

    def text(self) -> str:
        return f'"{self.name}"'

    def span(self) -> tuple[bytes, bytes]:
        raw = self.name.encode()
        if not raw or len(raw) >= IFNAMSIZ or b"*" in raw or b'"' in raw:
            raise Unencodable(f"interface name {self.name!r}")
        padded = raw + b"\0" * (IFNAMSIZ - len(raw))
        return padded, padded


@dataclass(frozen=True, order=True)
class Mac:
    mac: str
    kind: ClassVar[str] = "ether_addr"

    def text(self) -> str:
        return self.mac

    def span(self) -> tuple[bytes, bytes]:
        parts = self.mac.split(":")
        try:
            octets = bytes(int(p, 16) for p in parts)
        except ValueError as exc:
            raise Unencodable(f"MAC {self.mac!r}") from exc
        if len(parts) != 6 or any(len(p) != 2 for p in parts):
            raise Unencodable(f"MAC {self.mac!r}")
        return octets, octets


@dataclass(frozen=True, order=True)
class Addresses:
    """An IPv4 or IPv6 address, or an inclusive range of them (a prefix is one)."""

    version: int
    low: int
    high: int

    @property
    def kind(self) -> str:
        return "ipv4_addr" if self.version == 4 else "ipv6_addr"

    def text(self) -> str:
        cls = ipaddress.IPv4Address if self.version == 4 else ipaddress.IPv6Address
        if self.low == self.high:
            return str(cls(self.low))
        nets = list(ipaddress.summarize_address_range(cls(self.low), cls(self.high)))
        return str(nets[0]) if len(nets) == 1 else f"{cls(self.low)}-{cls(self.high)}"

    def span(self) -> tuple[bytes, bytes]:
        size = 4 if self.version == 4 else 16
        if not 0 <= self.low <= self.high < 1 << (8 * size):
            raise Unencodable(f"address range {self.low}-{self.high}")
        return self.low.to_bytes(size, "big"), self.high.to_bytes(size, "big")


@dataclass(frozen=True, order=True)
class Numbers:
    """A number of one nft type (protocol, port, ICMP type or code, mark, a raw 128-bit
    payload), or an inclusive range of them."""

    kind: str
    low: int
    high: int

    def text(self) -> str:
        if self.kind == "integer128":
            low, high = (f"0x{value:032x}" for value in (self.low, self.high))
        elif self.kind == "mark":
            low, high = f"{self.low:#x}", f"{self.high:#x}"
        else:
            low, high = str(self.low), str(self.high)
        return low if self.low == self.high else f"{low}-{high}"

    def span(self) -> tuple[bytes, bytes]:
        width = _WIDTH.get(self.kind)
        if width is None or self.kind in ("ifname", "ether_addr", "ipv4_addr", "ipv6_addr"):
            raise Unencodable(f"number of type {self.kind!r}")
        if not 0 <= self.low <= self.high < 1 << (8 * width):
            raise Unencodable(f"{self.kind} {self.text()!r} is out of range")
        if self.kind == "mark":  # host byte order, as meta mark loads it
            return struct.pack("=I", self.low), struct.pack("=I", self.high)
        return self.low.to_bytes(width, "big"), self.high.to_bytes(width, "big")


@dataclass(frozen=True, order=True)
class Jump:
    """A verdict map's data: jump to a chain."""

    chain: str
    kind: ClassVar[str] = "verdict"

    def text(self) -> str:
        return f"jump {self.chain}"

    def span(self) -> tuple[bytes, bytes]:
        raise Unencodable("a verdict is not a key")


KeyField = IfName | Mac | Addresses | Numbers


@dataclass(frozen=True, order=True)
class Element:
    """One element of a set or map: its key's fields (a concatenation when several) and, for
    a map, its data. The compiler builds these; nft's text and the kernel's bytes are both
    rendered from them."""

    key: tuple[KeyField, ...]
    data: Numbers | Jump | None = None

    def text(self) -> str:
        key = " . ".join(field.text() for field in self.key)
        return key if self.data is None else f"{key} : {self.data.text()}"
