"""A deliberately minimal memif client for feeding the master bad input (the good client is
DPDK's testpmd). Messages are the protocol's 128-byte records, built field by field."""

from __future__ import annotations

import array
import fcntl
import os
import socket
import struct

MSG = 128
ACK, HELLO, INIT, ADD_REGION, ADD_RING, CONNECT, CONNECTED, DISCONNECT = 1, 2, 3, 4, 5, 6, 7, 8
F_ADD_SEALS, F_SEAL_SHRINK = 1033, 0x0002
COOKIE = 0x3E31F20


def message(kind: int, body: bytes = b"") -> bytes:
    return (struct.pack("<H", kind) + body).ljust(MSG, b"\0")


def init(secret: str, version: int = 0x0200, mode: int = 0) -> bytes:
    body = struct.pack("<HIB", version, 0, mode) + secret.encode().ljust(24, b"\0")
    return message(INIT, body + b"pytest".ljust(32, b"\0"))


def add_region(index: int, size: int) -> bytes:
    return message(ADD_REGION, struct.pack("<HQ", index, size))


def add_ring(index: int, log2: int, c2s: bool, offset: int = 0, region: int = 0) -> bytes:
    return message(ADD_RING, struct.pack("<HHHIBH", int(c2s), index, region, offset, log2, 0))


def region_fd(size: int, sealed: bool = True) -> int:
    fd = os.memfd_create("pw-test-region", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if sealed:
        fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)
    return fd


class Client:
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(timeout)
        self.sock.connect(path)

    def recv(self) -> tuple[int, bytes]:
        data = self.sock.recv(MSG + 1)
        if not data:
            return 0, b""
        return struct.unpack_from("<H", data)[0], data

    def send(self, data: bytes, fd: int | None = None) -> None:
        ancillary = []
        if fd is not None:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
        self.sock.sendmsg([data], ancillary)

    def request(self, data: bytes, fd: int | None = None) -> tuple[int, bytes]:
        self.send(data, fd)
        return self.recv()

    def close(self) -> None:
        self.sock.close()


def disconnect_reason(data: bytes) -> str:
    return data[6:102].split(b"\0", 1)[0].decode()
