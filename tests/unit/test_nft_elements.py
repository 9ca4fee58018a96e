"""Packing typed set elements for nf_tables: the bytes libnftables sends for their text
(checked against ``nft --debug=netlink`` on this kernel), and a refusal for whatever is not
podwire's."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import sys
import time

import pytest

from podwire.netfilter.elements import (
    Addresses,
    Element,
    ElementChange,
    IfName,
    Jump,
    Mac,
    Numbers,
    Packed,
    Unencodable,
    layout,
    pack,
    pack_all,
)
from podwire.netfilter.nfnl import MAX_NEST, TIMEOUT, NfnlSocket, bodies
from podwire.netlink.rtnl import NLMSG_ERROR, RtnlError, message

IFNAME = b"pwp7e5700000101" + b"\0"
MAC = bytes.fromhex("fa163e000065") + b"\0\0"
DEVICE, SOURCE = IfName("pwp7e5700000101"), Mac("fa:16:3e:00:00:65")


def v4(low: str, high: str | None = None) -> Addresses:
    first = int(ipaddress.IPv4Address(low))
    return Addresses(4, first, int(ipaddress.IPv4Address(high)) if high else first)


def v6(low: str, high: str | None = None) -> Addresses:
    first = int(ipaddress.IPv6Address(low))
    return Addresses(6, first, int(ipaddress.IPv6Address(high)) if high else first)


def num(kind: str, low: int, high: int | None = None) -> Numbers:
    return Numbers(kind, low, low if high is None else high)


def test_concatenated_interval_has_a_closing_key_per_field() -> None:
    shape = layout("type ifname . ether_addr . ipv4_addr; flags interval;")
    element = Element((DEVICE, SOURCE, v4("10.9.0.0", "10.9.0.255")))
    assert element.text() == '"pwp7e5700000101" . fa:16:3e:00:00:65 . 10.9.0.0/24'
    got = pack(shape, element)
    assert got.key == IFNAME + MAC + socket.inet_aton("10.9.0.0")
    assert got.key_end == IFNAME + MAC + socket.inet_aton("10.9.0.255")
    six = layout("type ifname . ether_addr . ipv6_addr; flags interval;")
    host = pack(six, Element((DEVICE, SOURCE, v6("fd00:9::65"))))
    assert (
        host.key == host.key_end == IFNAME + MAC + socket.inet_pton(socket.AF_INET6, "fd00:9::65")
    )


def test_nd_targets_are_raw_128_bit_payloads_in_network_order() -> None:
    """A ``typeof`` key of ``iifname . ether saddr . @th,64,128``: the bytes nft sends for
    ``"pwp1" . 02:00:00:00:00:01 . 0xfe80...01`` (``nft --debug=netlink``)."""
    exact = layout("typeof iifname . ether saddr . @th,64,128;")
    target = num("integer128", int(ipaddress.IPv6Address("fe80::1")))
    element = Element((IfName("pwp1"), Mac("02:00:00:00:00:01"), target))
    assert element.text() == '"pwp1" . 02:00:00:00:00:01 . 0xfe800000000000000000000000000001'
    got = pack(exact, element)
    address = socket.inet_pton(socket.AF_INET6, "fe80::1")
    assert got.key == b"pwp1" + b"\0" * 12 + bytes.fromhex("020000000001") + b"\0\0" + address
    ranged = layout("typeof iifname . ether saddr . @th,64,128; flags interval;")
    span = num("integer128", 0x20010DB8 << 96, (0x20010DB9 << 96) - 1)
    got = pack(ranged, Element((IfName("pwp1"), Mac("02:00:00:00:00:01"), span)))
    assert got.key_end is not None
    assert got.key_end[-16:] == socket.inet_pton(
        socket.AF_INET6, "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"
    )


def test_a_one_field_interval_is_its_start_and_the_value_after_its_end() -> None:
    """As libnftables sends ``10.1.0.7`` and ``10.2.0.0/16`` to an ``ipv4_addr`` interval set
    (``nft --debug=netlink``): the start, and the next address flagged as an interval end."""
    shape = layout("type ipv4_addr; flags interval;")
    assert pack_all(shape, Element((v4("10.1.0.7"),))) == [
        Packed(socket.inet_aton("10.1.0.7")),
        Packed(socket.inet_aton("10.1.0.8"), interval_end=True),
    ]
    wide = pack_all(shape, Element((v4("10.2.0.0", "10.2.255.255"),)))
    assert wide[1].key == socket.inet_aton("10.3.0.0")
    last = Element((v4("255.255.255.0", "255.255.255.255"),))
    assert pack_all(shape, last) == [Packed(socket.inet_aton("255.255.255.0"))]
    six = pack_all(layout("type ipv6_addr; flags interval;"), Element((v6("fd00::1"),)))
    assert six[1].key == socket.inet_pton(socket.AF_INET6, "fd00::2") and six[1].interval_end
    spec = "type ipv4_addr; flags interval;"
    change = ElementChange("inet", "t", "s", spec, "add", frozenset({Element((v4("10.1.0.7"),))}))
    ((_kind, _flags, body),) = bodies(change)
    flags_attr = struct.pack("=HH", 8, 3) + struct.pack(">I", 1)  # NFTA_SET_ELEM_FLAGS: END
    assert body.count(flags_attr) == 1


def test_maps_carry_marks_in_host_order_and_verdicts_by_chain() -> None:
    data = Element((IfName("pwp1"),), num("mark", 101))
    assert pack(layout("type ifname : mark;"), data) == Packed(
        b"pwp1" + b"\0" * 12, value=(101).to_bytes(4, sys.byteorder)
    )
    jump = Element((num("mark", 0x650000),), Jump("pol_15923c2dedbe_in"))
    assert jump.text() == "0x650000 : jump pol_15923c2dedbe_in"
    verdict = pack(layout("type mark : verdict;"), jump)
    assert verdict.verdict == (-3, "pol_15923c2dedbe_in")
    assert verdict.key == (0x650000).to_bytes(4, sys.byteorder)


def test_ports_and_protocols_are_big_endian_ranges_in_whole_registers() -> None:
    shape = layout("type ipv4_addr . inet_proto . inet_service; flags interval;")
    element = Element(
        (v4("10.0.0.0", "10.0.0.255"), num("inet_proto", 6), num("inet_service", 1000, 1005))
    )
    got = pack(shape, element)
    assert got.key == socket.inet_aton("10.0.0.0") + b"\x06\0\0\0" + b"\x03\xe8\0\0"
    assert got.key_end == socket.inet_aton("10.0.0.255") + b"\x06\0\0\0" + b"\x03\xed\0\0"
    icmp_element = Element((num("icmp_type", 8), num("icmp_code", 0, 255)))
    assert icmp_element.text() == "8 . 0-255"
    icmp = pack(layout("type icmp_type . icmp_code; flags interval;"), icmp_element)
    assert (icmp.key, icmp.key_end) == (b"\x08\0\0\0\0\0\0\0", b"\x08\0\0\0\xff\0\0\0")


@pytest.mark.parametrize(
    ("spec", "element"),
    [
        ("type ipv4_addr; flags timeout;", Element((v4("10.0.0.1"),))),
        ("type ct_state;", Element((num("ct_state", 2),))),
        ("type ifname;", Element((IfName("pwp*"),))),  # a wildcard is not a name
        ("type ifname;", Element((IfName("a-name-longer-than-15"),))),
        ("type ifname;", Element((IfName('q"uote'),))),
        ("type ether_addr;", Element((Mac("fa:16:3e:00:00"),))),
        ("type ipv4_addr;", Element((v6("fd00::1"),))),  # the wrong family
        ("type ipv4_addr;", Element((v4("10.0.0.0", "10.255.255.255"),))),  # a range, no intervals
        ("type ether_addr; flags interval;", Element((SOURCE,))),  # not a number range
        ("type mark; flags interval;", Element((num("mark", 1, 5),))),  # no ordered range
        ("type inet_service;", Element((num("inet_service", 70000),))),
        ("type inet_proto . inet_service;", Element((num("inet_proto", 6),))),  # a field missing
        ("type mark : verdict;", Element((num("mark", 1),))),  # no verdict
        ("type mark : verdict;", Element((num("mark", 1),), num("mark", 2))),  # not a verdict
        ("typeof ip saddr;", Element((v4("10.0.0.1"),))),  # an expression not podwire's
        ("typeof iifname . @th,64,128;", Element((IfName("pwp1"), num("integer128", 1 << 128)))),
    ],
)
def test_what_is_not_podwires_is_refused_before_anything_is_sent(
    spec: str, element: Element
) -> None:
    with pytest.raises(Unencodable):
        bodies(ElementChange("bridge", "podwire", "s", spec, "add", frozenset({element})))


def test_a_large_change_is_split_where_an_attribute_would_overflow() -> None:
    elements = frozenset(
        Element((IfName(f"pwp{i:011d}"), Mac(f"fa:16:3e:00:{i // 256:02x}:{i % 256:02x}")))
        for i in range(3000)
    )
    change = ElementChange(
        "bridge", "podwire", "src_mac", "type ifname . ether_addr;", "add", elements
    )
    parts = bodies(change)
    assert len(parts) > 1
    assert all(len(body) < MAX_NEST + 200 for _, _, body in parts)


def test_an_error_is_raised_at_once_even_if_other_answers_never_come() -> None:
    """The kernel answers a whole batch at once; after an error, nothing is waited for."""
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    nfnl = NfnlSocket.__new__(NfnlSocket)
    nfnl._sock, nfnl._seq = ours, 0
    ours.settimeout(TIMEOUT)
    refused = struct.pack("=i", -errno.ENOENT) + message(0, 0, 2, b"")
    kernel.send(message(NLMSG_ERROR, 0, 2, refused))
    started = time.monotonic()
    with pytest.raises(RtnlError, match="delete element bridge podwire src_mac"):
        nfnl._acks(1, {2: "delete element bridge podwire src_mac", 3: "add element ..."})
    assert time.monotonic() - started < 1.0
    assert ours.gettimeout() == TIMEOUT
    ours.close()
    kernel.close()
