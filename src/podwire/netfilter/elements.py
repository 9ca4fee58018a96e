"""Set element changes as values, and their nf_tables netlink encoding.

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

from podwire.errors import PermanentError

NFT_JUMP, NFT_GOTO = -3, -4
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
    elements: frozenset[str]

    def text(self) -> str:
        # Sorted, so equal changes give equal buffers (tests and logs compare them).
        listed = ", ".join(sorted(self.elements))
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


def pack_all(item: _Layout, element: str) -> list[Packed]:
    """The kernel elements of one element of text: one, or a one-field interval's two."""
    if not (item.interval and len(item.key) == 1):
        return [pack(item, element)]
    low, high = _field(item.key[0], element.strip(), True)
    start = Packed(_padded(low))
    following = int.from_bytes(high, "big") + 1
    if following >> (8 * len(high)):  # the range reaches the last value: no closing element
        return [start]
    return [start, Packed(_padded(following.to_bytes(len(high), "big")), interval_end=True)]


def pack(item: _Layout, element: str) -> Packed:
    """One element of a set that is not a one-field interval set (``pack_all`` takes both)."""
    if item.interval and len(item.key) == 1:
        raise Unencodable(f"element {element!r} of a one-field interval set")
    key_text, sep, data_text = element.partition(" : ")
    if bool(sep) != (item.data is not None):
        raise Unencodable(f"element {element!r}")
    fields = key_text.split(" . ")
    if len(fields) != len(item.key):
        raise Unencodable(f"element {element!r} for key {' . '.join(item.key)}")
    starts, ends = [], []
    for kind, text in zip(item.key, fields, strict=True):
        start, end = _field(kind, text.strip(), item.interval)
        starts.append(_padded(start))
        ends.append(_padded(end))
    key, key_end = b"".join(starts), b"".join(ends)
    packed = Packed(key, key_end if item.interval else None)
    if item.data == "verdict":
        return Packed(packed.key, packed.key_end, verdict=_verdict(data_text.strip()))
    if item.data is not None:
        value, _ = _field(item.data, data_text.strip(), False)
        return Packed(packed.key, packed.key_end, value=value)
    return packed


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


def _field(kind: str, text: str, interval: bool) -> tuple[bytes, bytes]:
    """A field's first and last value in kernel byte order (equal unless a range)."""
    if kind == "ifname":
        return (_ifname(text),) * 2
    if kind == "ether_addr":
        return (_mac(text),) * 2
    if kind in ("ipv4_addr", "ipv6_addr"):
        return _address(kind, text, interval)
    width = _WIDTH[kind]
    low, high = _number_range(text, interval, 1 << (8 * width))
    if kind == "mark":  # host byte order, as meta mark loads it
        return struct.pack("=I", low), struct.pack("=I", high)
    return low.to_bytes(width, "big"), high.to_bytes(width, "big")


def _ifname(text: str) -> bytes:
    if len(text) < 2 or text[0] != '"' or text[-1] != '"' or '"' in text[1:-1]:
        raise Unencodable(f"interface name {text!r}")
    name = text[1:-1].encode()
    if not name or len(name) >= IFNAMSIZ or b"*" in name:
        raise Unencodable(f"interface name {text!r}")
    return name + b"\0" * (IFNAMSIZ - len(name))


def _mac(text: str) -> bytes:
    parts = text.split(":")
    try:
        octets = bytes(int(p, 16) for p in parts)
    except ValueError as exc:
        raise Unencodable(f"MAC {text!r}") from exc
    if len(parts) != 6 or any(len(p) != 2 for p in parts):
        raise Unencodable(f"MAC {text!r}")
    return octets


def _address(kind: str, text: str, interval: bool) -> tuple[bytes, bytes]:
    version = 4 if kind == "ipv4_addr" else 6
    try:
        if "-" in text and interval:
            first, _, last = text.partition("-")
            low, high = ipaddress.ip_address(first), ipaddress.ip_address(last)
        elif "/" in text and interval:
            net = ipaddress.ip_network(text)
            low, high = net.network_address, net.broadcast_address
        else:
            low = high = ipaddress.ip_address(text)
    except ValueError as exc:
        raise Unencodable(f"address {text!r}") from exc
    if low.version != version or high.version != version or int(low) > int(high):
        raise Unencodable(f"address {text!r} for {kind}")
    return low.packed, high.packed


def _number_range(text: str, interval: bool, bound: int) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    if sep and not interval:
        raise Unencodable(f"range {text!r} in a set without intervals")
    try:
        low = int(first, 0)
        high = int(last, 0) if sep else low
    except ValueError as exc:
        raise Unencodable(f"number {text!r}") from exc
    if not 0 <= low <= high < bound:
        raise Unencodable(f"number {text!r} is out of range")
    return low, high


def _verdict(text: str) -> tuple[int, str]:
    verb, _, chain = text.partition(" ")
    codes = {"jump": NFT_JUMP, "goto": NFT_GOTO}
    if verb not in codes or not chain or " " in chain or len(chain) > 255:
        raise Unencodable(f"verdict {text!r}")
    return codes[verb], chain
