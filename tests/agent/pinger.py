"""A minimal ICMP echo (the test machines have no ``ping``): exit 0 on a reply, 1 otherwise.

Run inside a namespace: ``ip netns exec NS python pinger.py ADDRESS [TIMEOUT]``.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import time


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def ping(address: str, timeout: float) -> bool:
    ident = os.getpid() & 0xFFFF
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        deadline = time.monotonic() + timeout
        seq = 0
        while time.monotonic() < deadline:
            seq += 1
            header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
            payload = b"podwire"
            packet = struct.pack("!BBHHH", 8, 0, _checksum(header + payload), ident, seq) + payload
            sock.sendto(packet, (address, 0))
            end = min(deadline, time.monotonic() + 0.5)
            while time.monotonic() < end:
                ready, _, _ = select.select([sock], [], [], max(0.0, end - time.monotonic()))
                if not ready:
                    break
                data, (src, _) = sock.recvfrom(2048)
                icmp = data[(data[0] & 0x0F) * 4 :]
                kind, _, _, rid, _ = struct.unpack("!BBHHH", icmp[:8])
                if kind == 0 and rid == ident and src == address:
                    return True
    return False


if __name__ == "__main__":
    sys.exit(0 if ping(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 3.0) else 1)
