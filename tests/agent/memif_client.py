"""A deliberately minimal memif client for feeding the master bad input (the good client is
DPDK's testpmd), and ``RingClient``, one that exchanges frames through its rings. Messages
are the protocol's 128-byte records, built field by field."""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import socket
import struct
import time

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


class RingClient:
    """A connected client that sends and receives frames, as a CNF does (copy mode): one
    region, a ring each way of ``SLOTS`` slots, ``BUFFER``-byte buffers, every S2C buffer
    offered to the master and offered again once read."""

    LOG2 = 6
    SLOTS = 1 << LOG2
    BUFFER = 2048
    REGION = 1 << 20
    C2S, S2C = 0, 4096  # the rings' offsets in the region
    C2S_BUFFERS, S2C_BUFFERS = 65536, 65536 + SLOTS * BUFFER

    def __init__(self, path: str, secret: str) -> None:
        self.client = Client(path)
        assert self.client.recv()[0] == HELLO
        assert self.client.request(init(secret))[0] == ACK
        fd = region_fd(self.REGION)
        self.region = mmap.mmap(fd, self.REGION)
        # Ring indexes go through this view, one 16-bit load or store each, as a CNF's do:
        # struct.pack_into zeroes its bytes before it writes them, and the master, reading a
        # head of 0 in between, refuses the client.
        self._words = memoryview(self.region).cast("H")
        for ring in (self.C2S, self.S2C):
            struct.pack_into("<I", self.region, ring, COOKIE)
        self.c2s_event = os.eventfd(0, os.EFD_NONBLOCK)
        self.s2c_event = os.eventfd(0, os.EFD_NONBLOCK)  # never read: received() polls
        steps = (
            (add_region(0, self.REGION), fd),
            (add_ring(0, self.LOG2, True, offset=self.C2S), self.c2s_event),
            (add_ring(0, self.LOG2, False, offset=self.S2C), self.s2c_event),
        )
        for data, step_fd in steps:
            assert self.client.request(data, step_fd)[0] == ACK
        os.close(fd)
        self.sent = 0  # C2S head
        self.seen = 0  # S2C slots read
        self._offer(0, self.SLOTS)
        assert self.client.request(message(CONNECT))[0] == CONNECTED

    def _slot(self, ring: int, index: int) -> int:
        return ring + 128 + 16 * (index % self.SLOTS)

    def _offer(self, first: int, count: int) -> None:
        """Offer the buffers of S2C slots first..first+count-1 again (the master wrote their
        lengths) and move the head one ring ahead of what was read."""
        for index in range(first, first + count):
            offset = self.S2C_BUFFERS + (index % self.SLOTS) * self.BUFFER
            struct.pack_into("<HHIII", self.region, self._slot(self.S2C, index), 0, 0,
                             self.BUFFER, offset, 0)  # fmt: skip
        self._words[(self.S2C + 6) // 2] = (self.seen + self.SLOTS) & 0xFFFF

    def send(self, frame: bytes) -> None:
        """Put one frame (at most BUFFER bytes) on the C2S ring and wake the master."""
        deadline = time.monotonic() + 5
        while (self.sent - self._words[(self.C2S + 64) // 2]) & 0xFFFF >= (self.SLOTS):
            assert time.monotonic() < deadline, "the master does not drain the C2S ring"
            time.sleep(0.001)
        offset = self.C2S_BUFFERS + (self.sent % self.SLOTS) * self.BUFFER
        self.region[offset : offset + len(frame)] = frame
        struct.pack_into("<HHIII", self.region, self._slot(self.C2S, self.sent), 0, 0,
                         len(frame), offset, 0)  # fmt: skip
        self.sent = (self.sent + 1) & 0xFFFF
        self._words[(self.C2S + 6) // 2] = self.sent
        os.eventfd_write(self.c2s_event, 1)

    def received(self) -> list[bytes]:
        """The frames the master put on the S2C ring since the last call (chains joined)."""
        tail = self._words[(self.S2C + 64) // 2]
        frames: list[bytes] = []
        data = b""
        first = self.seen
        while self.seen != tail:
            flags, _, length, offset, _ = struct.unpack_from(
                "<HHIII", self.region, self._slot(self.S2C, self.seen)
            )
            data += self.region[offset : offset + length]
            self.seen = (self.seen + 1) & 0xFFFF
            if not flags & 1:
                frames.append(data)
                data = b""
        self._offer(first, (self.seen - first) & 0xFFFF)
        return frames

    def until(self, wanted: bytes, within: float = 5.0) -> list[bytes]:
        """Every frame received up to and without ``wanted`` (a frame's first bytes)."""
        got: list[bytes] = []
        deadline = time.monotonic() + within
        while True:
            for frame in self.received():
                if frame[: len(wanted)] == wanted:
                    return got
                got.append(frame)
            assert time.monotonic() < deadline, "the awaited frame did not arrive"
            time.sleep(0.001)

    def close(self) -> None:
        self.client.close()
        self._words.release()
        self.region.close()
        os.close(self.c2s_event)
        os.close(self.s2c_event)
