"""Packing set elements for nf_tables: the bytes libnftables sends (checked against
``nft --debug=netlink`` on this kernel), and a refusal for whatever is not podwire's."""

from __future__ import annotations

import errno
import socket
import struct
import sys
import time

import pytest

from podwire.netfilter.elements import (
    ElementChange,
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


def test_concatenated_interval_has_a_closing_key_per_field() -> None:
    shape = layout("type ifname . ether_addr . ipv4_addr; flags interval;")
    got = pack(shape, '"pwp7e5700000101" . fa:16:3e:00:00:65 . 10.9.0.0/24')
    assert got.key == IFNAME + MAC + socket.inet_aton("10.9.0.0")
    assert got.key_end == IFNAME + MAC + socket.inet_aton("10.9.0.255")
    six = layout("type ifname . ether_addr . ipv6_addr; flags interval;")
    host = pack(six, '"pwp7e5700000101" . fa:16:3e:00:00:65 . fd00:9::65/128')
    assert (
        host.key == host.key_end == IFNAME + MAC + socket.inet_pton(socket.AF_INET6, "fd00:9::65")
    )


def test_nd_targets_are_raw_128_bit_payloads_in_network_order() -> None:
    """A ``typeof`` key of ``iifname . ether saddr . @th,64,128``: the bytes nft sends for
    ``"pwp1" . 02:00:00:00:00:01 . 0xfe80...01`` (``nft --debug=netlink``)."""
    exact = layout("typeof iifname . ether saddr . @th,64,128;")
    got = pack(exact, '"pwp1" . 02:00:00:00:00:01 . 0xfe800000000000000000000000000001')
    address = socket.inet_pton(socket.AF_INET6, "fe80::1")
    assert got.key == b"pwp1" + b"\0" * 12 + bytes.fromhex("020000000001") + b"\0\0" + address
    ranged = layout("typeof iifname . ether saddr . @th,64,128; flags interval;")
    low, high = (f"0x{n:032x}" for n in (0x20010DB8 << 96, (0x20010DB9 << 96) - 1))
    got = pack(ranged, f'"pwp1" . 02:00:00:00:00:01 . {low}-{high}')
    assert got.key_end is not None
    assert got.key_end[-16:] == socket.inet_pton(
        socket.AF_INET6, "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"
    )


def test_a_one_field_interval_is_its_start_and_the_value_after_its_end() -> None:
    """As libnftables sends ``10.1.0.7`` and ``10.2.0.0/16`` to an ``ipv4_addr`` interval set
    (``nft --debug=netlink``): the start, and the next address flagged as an interval end."""
    shape = layout("type ipv4_addr; flags interval;")
    assert pack_all(shape, "10.1.0.7") == [
        Packed(socket.inet_aton("10.1.0.7")),
        Packed(socket.inet_aton("10.1.0.8"), interval_end=True),
    ]
    assert pack_all(shape, "10.2.0.0/16")[1].key == socket.inet_aton("10.3.0.0")
    assert pack_all(shape, "255.255.255.0/24") == [Packed(socket.inet_aton("255.255.255.0"))]
    six = pack_all(layout("type ipv6_addr; flags interval;"), "fd00::1")
    assert six[1].key == socket.inet_pton(socket.AF_INET6, "fd00::2") and six[1].interval_end
    ((_kind, _flags, body),) = bodies(
        ElementChange(
            "inet", "t", "s", "type ipv4_addr; flags interval;", "add", frozenset({"10.1.0.7"})
        )
    )
    flags_attr = struct.pack("=HH", 8, 3) + struct.pack(">I", 1)  # NFTA_SET_ELEM_FLAGS: END
    assert body.count(flags_attr) == 1


def test_maps_carry_marks_in_host_order_and_verdicts_by_chain() -> None:
    assert pack(layout("type ifname : mark;"), '"pwp1" : 101') == Packed(
        b"pwp1" + b"\0" * 12, value=(101).to_bytes(4, sys.byteorder)
    )
    verdict = pack(layout("type mark : verdict;"), "0x650000 : jump pol_15923c2dedbe_in")
    assert verdict.verdict == (-3, "pol_15923c2dedbe_in")
    assert verdict.key == (0x650000).to_bytes(4, sys.byteorder)


def test_ports_and_protocols_are_big_endian_ranges_in_whole_registers() -> None:
    shape = layout("type ipv4_addr . inet_proto . inet_service; flags interval;")
    got = pack(shape, "10.0.0.0-10.0.0.255 . 6 . 1000-1005")
    assert got.key == socket.inet_aton("10.0.0.0") + b"\x06\0\0\0" + b"\x03\xe8\0\0"
    assert got.key_end == socket.inet_aton("10.0.0.255") + b"\x06\0\0\0" + b"\x03\xed\0\0"
    icmp = pack(layout("type icmp_type . icmp_code; flags interval;"), "8 . 0-255")
    assert (icmp.key, icmp.key_end) == (b"\x08\0\0\0\0\0\0\0", b"\x08\0\0\0\xff\0\0\0")


@pytest.mark.parametrize(
    ("spec", "element"),
    [
        ("type ipv4_addr; flags timeout;", "10.0.0.1"),
        ("type ct_state;", "established"),
        ("type ifname;", '"pwp*"'),  # a wildcard is not a name
        ("type ifname;", '"a-name-longer-than-15"'),
        ("type ifname;", "unquoted"),
        ("type ether_addr;", "fa:16:3e:00:00"),
        ("type ipv4_addr;", "fd00::1"),  # the wrong family
        ("type ipv4_addr;", "10.0.0.0/8"),  # a prefix in a set without intervals
        ("type ether_addr; flags interval;", "fa:16:3e:00:00:01"),  # not a number range
        ("type mark; flags interval;", "1-5"),  # host byte order: no ordered range
        ("type inet_service;", "70000"),
        ("type inet_proto . inet_service;", "6"),  # a field missing
        ("type mark : verdict;", "1 : accept"),
        ("type mark : verdict;", "1"),
        ("typeof ip saddr;", "10.0.0.1"),  # an expression podwire's sets do not use
        ("typeof iifname . @th,64,128;", '"pwp1" . 0x1' + "0" * 32),  # wider than 128 bits
    ],
)
def test_what_is_not_podwires_is_refused_before_anything_is_sent(spec: str, element: str) -> None:
    with pytest.raises(Unencodable):
        bodies(ElementChange("bridge", "podwire", "s", spec, "add", frozenset({element})))


def test_a_large_change_is_split_where_an_attribute_would_overflow() -> None:
    elements = frozenset(
        f'"pwp{i:011d}" . fa:16:3e:00:{i // 256:02x}:{i % 256:02x}' for i in range(3000)
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
