"""Gratuitous ARP and unsolicited neighbour advertisements on behalf of a remote port, sent to
this node's own ports of a network.

The bridge's neighbour suppression on the VXLAN port keeps gratuitous ARP and unsolicited NAs
from crossing between nodes (the kernel sends them from a local port to no suppressing port),
so a pod whose neighbour cache still holds an address's old MAC (a router interface removed and
added again: the same gateway address, a new port) would keep sending to it until its cache
entry expires, up to a minute. The agent announces instead: when a remote port appears, one
announcement per address (IPv4: a GARP request, sender and target the address, sender hardware
the port's MAC; IPv6: an unsolicited NA with the override flag and the MAC as target link-layer
address, to all nodes) goes out of each local port of the bridge, straight to the pod or guest
behind it, not through the bridge (so nothing floods back to other nodes, and no bridge learns
from it). Receivers update an entry they hold and create none.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

ETH_P_ARP, ETH_P_IPV6 = 0x0806, 0x86DD
BROADCAST = b"\xff" * 6
ALL_NODES = ipaddress.IPv6Address("ff02::1")
ALL_NODES_MAC = b"\x33\x33\x00\x00\x00\x01"
ICMPV6, NEIGHBOUR_ADVERT, OVERRIDE = 58, 136, 0x20000000
_ARP = struct.Struct("!HHBBH6s4s6s4s")


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def garp_frame(ip: str, mac: str, source_mac: str) -> bytes:
    address = ipaddress.IPv4Address(ip).packed
    ether = BROADCAST + _mac(source_mac) + struct.pack("!H", ETH_P_ARP)
    return ether + _ARP.pack(1, 0x0800, 6, 4, 1, _mac(mac), address, b"\0" * 6, address)


def unsolicited_na_frame(ip: str, mac: str, source_mac: str) -> bytes:
    """From the address itself (RFC 4861 allows any of the sender's addresses), hop limit 255."""
    target = ipaddress.IPv6Address(ip)
    option = struct.pack("!BB6s", 2, 1, _mac(mac))  # target link-layer address
    body = struct.pack("!BBHI16s", NEIGHBOUR_ADVERT, 0, 0, OVERRIDE, target.packed) + option
    checksum = _icmpv6_checksum(target, ALL_NODES, body)
    body = body[:2] + struct.pack("!H", checksum) + body[4:]
    header = struct.pack("!IHBB16s16s", 6 << 28, len(body), ICMPV6, 255, target.packed,
                         ALL_NODES.packed)  # fmt: skip
    return ALL_NODES_MAC + _mac(source_mac) + struct.pack("!H", ETH_P_IPV6) + header + body


def _icmpv6_checksum(
    source: ipaddress.IPv6Address, dest: ipaddress.IPv6Address, body: bytes
) -> int:
    pseudo = source.packed + dest.packed + struct.pack("!I3xB", len(body), ICMPV6)
    data = pseudo + body + b"\0" * (len(body) % 2)
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def announce(ports: list[str], ip: str, mac: str, source_mac: str) -> int:
    """Send the announcement out of each of ``ports`` (in the calling thread's namespace);
    returns how many took it (a port that vanished meanwhile is skipped)."""
    version = ipaddress.ip_address(ip).version
    frame = (garp_frame if version == 4 else unsolicited_na_frame)(ip, mac, source_mac)
    sent = 0
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        for port in ports:
            try:
                sock.sendto(frame, (port, ETH_P_ARP if version == 4 else ETH_P_IPV6))
            except OSError:
                continue
            sent += 1
    return sent
