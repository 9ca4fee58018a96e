"""Raw IPv6 neighbour-discovery frames, sent and captured inside a pod namespace.

``send IFNAME JSON`` writes one Ethernet frame per item of the JSON list (each names the
ICMPv6 ``kind``, the addresses and the ND target) on an AF_PACKET socket, so nothing in the
pod's own stack checks or changes them; ``sniff IFNAME SECONDS`` prints ``ready``, then one
JSON line per ND message seen on the interface: what a neighbour would have received.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import struct
import sys
import time
from typing import Any

ETH_P_IPV6 = 0x86DD
ICMPV6 = 58
TYPES = {"rs": 133, "ra": 134, "ns": 135, "na": 136, "redirect": 137}
NA_OVERRIDE = 0x20000000


def _mac(text: str) -> bytes:
    return bytes(int(part, 16) for part in text.split(":"))


def _ip6(text: str) -> bytes:
    return ipaddress.IPv6Address(text).packed


def checksum(data: bytes) -> int:
    """The internet checksum (RFC 1071); the classifier's differential test builds its frames
    with it too."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _body(item: dict[str, Any]) -> bytes:
    kind = item["kind"]
    target = _ip6(item.get("target", "::"))
    lladdr = _mac(item["lladdr"]) if item.get("lladdr") else b""
    if kind == "na":  # target link-layer address option (2)
        option = struct.pack("!BB", 2, 1) + lladdr if lladdr else b""
        return struct.pack("!I", NA_OVERRIDE) + target + option
    if kind == "ns":  # source link-layer address option (1); none in DAD
        option = struct.pack("!BB", 1, 1) + lladdr if lladdr else b""
        return b"\0" * 4 + target + option
    if kind == "redirect":
        return b"\0" * 4 + target + _ip6(item.get("destination", "::"))
    if kind == "ra":  # hop limit 64, router lifetime 1800 s
        return struct.pack("!BBHII", 64, 0, 1800, 0, 0)
    return b"\0" * 4  # rs


def frame(item: dict[str, Any]) -> bytes:
    src, dst = _ip6(item["src"]), _ip6(item["dst"])
    body = _body(item)
    length = 4 + len(body)
    pseudo = src + dst + struct.pack("!I3xB", length, ICMPV6)
    head = struct.pack("!BBH", TYPES[item["kind"]], 0, 0)
    summed = checksum(pseudo + head + body)
    icmp = struct.pack("!BBH", TYPES[item["kind"]], 0, summed) + body
    ip6 = struct.pack("!IHBB", 6 << 28, length, ICMPV6, 255) + src + dst
    eth = _mac(item["eth_dst"]) + _mac(item["eth_src"]) + struct.pack("!H", ETH_P_IPV6)
    return eth + ip6 + icmp


def send(ifname: str, items: list[dict[str, Any]]) -> None:
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        sock.bind((ifname, 0))
        for item in items:
            sock.send(frame(item))


def parse(data: bytes) -> dict[str, Any] | None:
    """An ND message's type, addresses and target; None for anything else."""
    if len(data) < 14 + 40 + 8 or struct.unpack("!H", data[12:14])[0] != ETH_P_IPV6:
        return None
    ip6 = data[14:54]
    if ip6[6] != ICMPV6:
        return None
    icmp = data[54:]
    names = {number: name for name, number in TYPES.items()}
    if icmp[0] not in names:
        return None
    out = {
        "kind": names[icmp[0]],
        "src": str(ipaddress.IPv6Address(ip6[8:24])),
        "eth_src": data[6:12].hex(":"),
    }
    if icmp[0] in (135, 136, 137) and len(icmp) >= 24:
        out["target"] = str(ipaddress.IPv6Address(icmp[8:24]))
    return out


def sniff(ifname: str, seconds: float) -> None:
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IPV6)) as sock:
        sock.bind((ifname, 0))
        sock.settimeout(0.05)
        print("ready", flush=True)
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            try:
                data = sock.recv(65535)
            except TimeoutError:
                continue
            found = parse(data)
            if found is not None:
                print(json.dumps(found, sort_keys=True), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(sys.argv[2], json.loads(sys.argv[3]))
    else:
        sniff(sys.argv[2], float(sys.argv[3]))
