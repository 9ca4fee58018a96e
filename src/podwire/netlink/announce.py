"""Gratuitous ARP on behalf of a remote port, sent to this node's own ports of a network.

The bridge's neighbour suppression on the VXLAN port keeps gratuitous ARP from crossing
between nodes (the kernel sends a GARP from a local port to no suppressing port), so a pod
whose neighbour cache still holds an address's old MAC (a router interface removed and added
again: the same gateway address, a new port) would keep sending to it until its cache entry
expires, up to a minute. The agent announces instead: when a remote port appears, a GARP
request (sender and target its address, sender hardware its MAC) goes out of each local port
of the bridge, straight to the pod or guest behind it, not through the bridge (so nothing
floods back to other nodes, and no bridge learns from it). Receivers update an entry they
hold and create none (``arp_accept`` off). IPv4 only: IPv6 neighbours re-probe by themselves
within seconds (neighbour unreachability detection).
"""

from __future__ import annotations

import ipaddress
import socket
import struct

ETH_P_ARP = 0x0806
BROADCAST = b"\xff" * 6
_ARP = struct.Struct("!HHBBH6s4s6s4s")


def garp_frame(ip: str, mac: str, source_mac: str) -> bytes:
    address = ipaddress.IPv4Address(ip).packed
    sender = bytes.fromhex(mac.replace(":", ""))
    ether = BROADCAST + bytes.fromhex(source_mac.replace(":", "")) + struct.pack("!H", ETH_P_ARP)
    arp = _ARP.pack(1, 0x0800, 6, 4, 1, sender, address, b"\0" * 6, address)
    return ether + arp


def announce(ports: list[str], ip: str, mac: str, source_mac: str) -> int:
    """Send the GARP out of each of ``ports`` (in the calling thread's namespace); returns
    how many took it (a port that vanished meanwhile is skipped)."""
    if ipaddress.ip_address(ip).version != 4:
        return 0
    frame = garp_frame(ip, mac, source_mac)
    sent = 0
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        for port in ports:
            try:
                sock.sendto(frame, (port, ETH_P_ARP))
            except OSError:
                continue
            sent += 1
    return sent
