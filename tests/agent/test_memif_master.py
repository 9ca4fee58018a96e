"""The memif master against bad clients: each is refused with its reason (told to the client
in a disconnect message and logged), and the master keeps listening for the next client."""

from __future__ import annotations

import array
import asyncio
import json
import mmap
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podwire.agent import naming
from podwire.config import MemifSettings
from podwire.memif import build as memif_build
from podwire.memif import master as memif_master
from podwire.netlink import HostNetlink, Netlink
from tests.agent import memif_client as mc
from tests.agent.netenv import NetEnv, in_ns

pytestmark = pytest.mark.skipif(memif_build.find() is None, reason="podwire-memif not built")

SECRET = "s3cret-for-the-test"
LIMITS = MemifSettings(
    max_regions=2, max_rings=2, max_log2_ring=10, max_region_mb=1, handshake_timeout=0.5
)
REGION = 1 << 20


TAP = "pwtmastertest"


@dataclass
class Master:
    socket: str
    log: Path
    pid: int
    started: int
    control: memif_master.MasterControl

    def client(self) -> mc.Client:
        client = mc.Client(self.socket)
        kind, _ = client.recv()
        assert kind == mc.HELLO
        return client

    def logged(self, reason: str, name: str = TAP) -> bool:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            if f'memif.refused name={name} reason="{reason}"' in self.log.read_text():
                return True
            time.sleep(0.02)
        return False


@pytest.fixture
def master(netenv: NetEnv, tmp_path: Path) -> Iterator[Master]:
    """The node's master with one port (tap ``TAP`` on a bridge of a namespace of its own)."""
    ns = netenv.namespace("mm")
    in_ns(ns, "ip", "link", "add", "br0", "type", "bridge")
    log = tmp_path / "master.log"
    binary = memif_build.find()
    assert binary is not None
    control_path = str(tmp_path / "control.sock")
    with open(log, "wb") as out:
        pid, started = memif_master.spawn(binary, control_path, LIMITS, stderr=out.fileno())
    control = memif_master.MasterControl(control_path)
    path = str(tmp_path / "memif.sock")
    try:
        add_port(control, ns, memif_master.PortSpec(TAP, path, SECRET, "br0", False))
        yield Master(path, log, pid, started, control)
    finally:
        control.close()
        memif_master.stop(pid, started)
    assert not memif_master.is_running(pid, started)


def add_port(control: memif_master.MasterControl, ns: str, spec: memif_master.PortSpec) -> None:
    host = HostNetlink(ns)
    try:
        fd = _run(host, Netlink.open_tap, spec.name, 1500, spec.domain, naming.MARK)
    finally:
        host.close()
    control.add(spec, fd)


def _run(host: HostNetlink, fn: Callable[..., int], *args: object) -> int:
    return asyncio.run(host.run(fn, *args))


def _refused(client: mc.Client) -> str:
    kind, data = client.recv()
    assert kind == mc.DISCONNECT, kind
    reason = mc.disconnect_reason(data)
    assert client.recv() == (0, b""), "the master must close the connection"
    client.close()
    return reason


def _inited(master: Master) -> mc.Client:
    client = master.client()
    assert client.request(mc.init(SECRET))[0] == mc.ACK
    return client


def test_hello_states_the_limits(master: Master) -> None:
    client = mc.Client(master.socket)
    kind, data = client.recv()
    assert kind == mc.HELLO
    min_v, max_v, max_region, max_s2c, max_c2s, max_log2 = struct.unpack_from("<HHHHHB", data, 34)
    assert (min_v, max_v, max_region, max_s2c, max_c2s, max_log2) == (0x200, 0x200, 1, 1, 1, 10)
    client.close()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"garbage", "message is not 128 bytes"),
        (b"\0" * 200, "message is not 128 bytes"),
        (mc.message(mc.ADD_REGION), "expected init"),
        (mc.init("wrong"), "incorrect secret"),
        (mc.init(""), "incorrect secret"),
        (mc.init(SECRET, version=0x0100), "incompatible memif version (this master speaks 2.0)"),
        (mc.init(SECRET, mode=1), "only ethernet mode is supported"),
    ],
)
def test_bad_first_message_refused_and_master_keeps_listening(
    master: Master, data: bytes, reason: str
) -> None:
    client = master.client()
    client.send(data)
    assert _refused(client) == reason
    assert master.logged(reason)
    good = _inited(master)  # the next client is served
    good.close()


def _event() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK)


def _region(size: int = REGION, sealed: bool = True) -> int:
    return mc.region_fd(size, sealed)


Step = tuple[bytes, "Callable[[], int] | None"]
REGION0: Step = (mc.add_region(0, REGION), _region)


def _ring(index: int, log2: int = 4, c2s: bool = True, **kw: int) -> Step:
    return (mc.add_ring(index, log2, c2s, **kw), _event)


CONNECT: Step = (mc.message(mc.CONNECT), None)
BAD_SETUPS: list[tuple[list[Step], str]] = [
    ([(mc.add_region(0, REGION), None)], "add_region without a region fd"),
    ([(mc.add_region(1, REGION), _region)], "region index out of order"),
    ([(mc.add_region(0, 2 * REGION), lambda: _region(2 * REGION))], "region size out of bounds"),
    (
        [(mc.add_region(0, REGION), lambda: _region(4096))],
        "region fd is not a file of the announced size",
    ),
    (
        [(mc.add_region(0, REGION), lambda: _region(sealed=False))],
        "region fd is not sealed against shrinking (F_SEAL_SHRINK)",
    ),
    ([(mc.add_region(i, REGION), _region) for i in range(3)], "too many regions"),
    ([REGION0, _ring(0, log2=11)], "ring size out of bounds"),
    ([REGION0, _ring(0, log2=0)], "ring size out of bounds"),
    ([REGION0, _ring(0, log2=10, offset=REGION - 64)], "ring outside its region"),
    ([REGION0, _ring(0, region=1)], "ring in an unknown region"),
    (
        [REGION0, (mc.add_ring(0, 4, True), lambda: os.pipe()[0])],
        "add_ring without an interrupt eventfd",
    ),
    ([REGION0, *(_ring(i, offset=i * 4096) for i in range(3))], "too many rings"),
    ([REGION0, CONNECT], "connect before a ring in each direction"),
    (
        [REGION0, _ring(0), _ring(0, c2s=False, offset=4096), CONNECT],
        "ring without the memif cookie",
    ),
    ([(mc.message(mc.HELLO), None)], "unexpected message type during setup"),
]


@pytest.mark.parametrize(("steps", "reason"), BAD_SETUPS)
def test_bad_setup_refused(master: Master, steps: list[Step], reason: str) -> None:
    client = _inited(master)
    *good, (last, make_fd) = steps
    for data, factory in good:
        fd = factory() if factory else None
        assert client.request(data, fd)[0] == mc.ACK
    client.send(last, make_fd() if make_fd else None)
    assert _refused(client) == reason
    assert master.logged(reason)


def test_client_that_never_answers_is_dropped(master: Master) -> None:
    client = master.client()
    started = time.monotonic()
    assert _refused(client) == "handshake not finished in time"
    assert time.monotonic() - started < 3
    assert _inited(master).request(mc.message(mc.DISCONNECT))[0] == 0  # closed, no answer


def test_second_client_refused_while_one_is_served(master: Master) -> None:
    first = _inited(master)
    second = mc.Client(master.socket)
    assert _refused(second) == "interface already has a client"
    first.close()


def test_connected_client_with_a_bogus_ring_head_is_dropped(master: Master) -> None:
    """A full handshake with rings the client wrote itself, then a head index beyond the ring:
    the master must not read past the ring; it drops the client."""
    client = _inited(master)
    fd = _region()
    region = mmap.mmap(fd, REGION)
    for offset in (0, 4096):
        struct.pack_into("<I", region, offset, mc.COOKIE)
    assert client.request(mc.add_region(0, REGION), fd)[0] == mc.ACK
    c2s_event = os.eventfd(0, os.EFD_NONBLOCK)
    assert client.request(mc.add_ring(0, 4, True), c2s_event)[0] == mc.ACK
    assert client.request(mc.add_ring(0, 4, False, offset=4096), _event())[0] == mc.ACK
    assert client.request(mc.message(mc.CONNECT))[0] == mc.CONNECTED
    struct.pack_into("<H", region, 6, 5000)  # C2S head: 5000 slots ready in a 16-slot ring
    os.eventfd_write(c2s_event, 1)
    assert _refused(client) == "C2S ring head out of range"
    assert master.logged("C2S ring head out of range")
    _inited(master).close()


def _tap_rx_packets(ns: str) -> int:
    out = in_ns(ns, "ip", "-s", "-j", "link", "show", TAP).stdout
    return int(json.loads(out)[0]["stats64"]["rx"]["packets"])


def test_descriptors_outside_the_region_are_dropped_good_frames_pass(
    master: Master, netenv: NetEnv
) -> None:
    client = _inited(master)
    fd = _region()
    region = mmap.mmap(fd, REGION)
    for offset in (0, 4096):
        struct.pack_into("<I", region, offset, mc.COOKIE)
    c2s_event = _event()
    for data, ring_fd in (
        (mc.add_region(0, REGION), fd),
        (mc.add_ring(0, 4, True), c2s_event),
        (mc.add_ring(0, 4, False, offset=4096), _event()),
    ):
        assert client.request(data, ring_fd)[0] == mc.ACK
    assert client.request(mc.message(mc.CONNECT))[0] == mc.CONNECTED
    ns = netenv.namespaces[-1]
    before = _tap_rx_packets(ns)
    frame = bytes.fromhex("ffffffffffff020000000001") + b"\x08\x06" + b"\0" * 46
    region[8192 : 8192 + len(frame)] = frame
    descriptors = [
        (0, 0, 100, REGION - 10),  # runs past the region's end
        (0, 7, 60, 8192),  # an unknown region
        (0, 0, len(frame), 8192),  # good
    ]
    for slot, (flags, index, length, offset) in enumerate(descriptors):
        struct.pack_into("<HHIII", region, 128 + 16 * slot, flags, index, length, offset, 0)
    struct.pack_into("<H", region, 6, len(descriptors))  # C2S head
    os.eventfd_write(c2s_event, 1)
    deadline = time.monotonic() + 2
    while struct.unpack_from("<H", region, 64)[0] != len(descriptors):  # C2S tail
        assert time.monotonic() < deadline, "the master did not consume the ring"
        time.sleep(0.01)
    assert _tap_rx_packets(ns) - before == 1
    client.sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        client.recv()  # still connected: bad descriptors cost a frame, not the session
    client.close()


def _raw_control(master: Master, request: bytes, fds: tuple[int, ...] = ()) -> str:
    """One request as bytes on a connection of its own; the master's reason, "" when OK."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(2)
    sock.connect(str(master.log.parent / "control.sock"))
    try:
        ancillary = []
        if fds:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sock.sendmsg([request], ancillary)
        reply = sock.recv(memif_master.REPLY_SIZE)
    finally:
        sock.close()
    status = struct.unpack_from("<I", reply)[0]
    return "" if status == memif_master.ST_OK else reply[4:].split(b"\0", 1)[0].decode()


def _req(op: int, name: bytes = b"pwtother", **kw: bytes) -> bytes:
    return memif_master.REQUEST.pack(
        op, name, kw.get("secret", b"s"), kw.get("domain", b"br0"), 0, kw.get("mac", b"")
    )


@pytest.mark.parametrize(
    ("request_bytes", "reason"),
    [
        (b"short", "request is not 80 bytes"),
        (_req(9), "unknown op"),
        (_req(memif_master.OP_REMOVE, b"bad name!"), "name must be 1-15 characters"),
        (_req(memif_master.OP_REMOVE, b""), "name must be 1-15 characters"),
        (_req(memif_master.OP_REMOVE), "no port of this name"),
        (_req(memif_master.OP_PATH), "no port of this name"),
        (_req(memif_master.OP_ADD), "add needs two descriptors"),
        (_req(memif_master.OP_LIST) + b"", ""),
        (_req(memif_master.OP_LIST)[:-1] + b"x", "reserved bytes must be zero"),
    ],
)
def test_bad_control_requests_refused_and_nothing_changes(
    master: Master, request_bytes: bytes, reason: str
) -> None:
    before = master.control.ports()
    assert _raw_control(master, request_bytes).startswith(reason)
    assert master.control.ports() == before  # the one port still served, untouched
    assert memif_master.is_running(master.pid, master.started)


def test_add_with_the_wrong_descriptors_refused(master: Master, tmp_path: Path) -> None:
    listener = memif_master.listen(str(tmp_path / "other.sock"))
    not_a_listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pipe_r, pipe_w = os.pipe()
    try:
        add = _req(memif_master.OP_ADD)
        wrong = {
            "the first descriptor is not a listening": (not_a_listener.fileno(), pipe_r),
            "the second descriptor is not the tap of this name": (listener.fileno(), pipe_r),
        }
        for reason, fds in wrong.items():
            assert _raw_control(master, add, fds).startswith(reason)
        bad_mac = _req(memif_master.OP_ADD, mac=bytes.fromhex("010000000001"))
        assert _raw_control(master, bad_mac, (listener.fileno(), pipe_r)).startswith(
            "mac must be a unicast address"
        )
        assert [p.name for p in master.control.ports()] == [TAP]
    finally:
        for closing in (listener, not_a_listener):
            closing.close()
        os.close(pipe_r)
        os.close(pipe_w)


# -- frames larger than one buffer: chained both ways -----------------------------------------

ETHERTYPE = 0x88B5  # IEEE local experimental: nothing else on the bridge sends it
BUFFER = 1024
S2C_RING, BUFFERS_AT = 4096, 16384


def _raw(ns: str, device: str, script: str, *args: str) -> subprocess.Popen[str]:
    """A raw AF_PACKET socket on ``device`` inside ``ns`` running ``script``."""
    code = f"import socket,sys\ns=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)\n{script}"
    argv = ["ip", "netns", "exec", ns, sys.executable, "-c", code, device, *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def _send_frame(ns: str, frame: bytes) -> None:
    script = "s.bind((sys.argv[1],0))\ns.send(bytes.fromhex(sys.argv[2]))"
    assert _raw(ns, "pwtinjpeer", script, frame.hex()).wait(timeout=10) == 0


def _frame(size: int, seed: int) -> bytes:
    head = bytes.fromhex("ffffffffffff02000000aa01") + struct.pack(">H", ETHERTYPE)
    return head + bytes((seed + i) % 251 for i in range(size - len(head)))


@pytest.fixture
def jumbo(master: Master, netenv: NetEnv) -> str:
    """The master's namespace with a 9000-byte MTU on its bridge, the tap and a veth whose peer
    injects and captures frames; IPv6 and multicast snooping off so nothing else talks there."""
    ns = netenv.namespaces[-1]
    for conf in ("all", "default"):
        in_ns(ns, "sysctl", "-qw", f"net.ipv6.conf.{conf}.disable_ipv6=1")
    in_ns(ns, "ip", "link", "set", "br0", "type", "bridge", "mcast_snooping", "0")  # no IGMP
    in_ns(ns, "ip", "link", "add", "pwtinject", "mtu", "9000", "type", "veth", "peer", "name",
          "pwtinjpeer", "mtu", "9000")  # fmt: skip
    for device in ("br0", TAP, "pwtinject", "pwtinjpeer"):
        in_ns(ns, "ip", "link", "set", device, "mtu", "9000", "up")
    in_ns(ns, "ip", "link", "set", "pwtinject", "master", "br0")
    return ns


def _connected(
    master: Master, log2: int = 4, buffer: int = BUFFER
) -> tuple[mc.Client, mmap.mmap, int]:
    """A client with a C2S ring at 0 of 16 slots and an S2C ring at S2C_RING of 2^log2, whose
    S2C descriptors point at ``buffer``-byte buffers from BUFFERS_AT; (client, region, C2S
    event)."""
    client = _inited(master)
    fd = _region()
    region = mmap.mmap(fd, REGION)
    for offset in (0, S2C_RING):
        struct.pack_into("<I", region, offset, mc.COOKIE)
    for slot in range(1 << log2):
        offset = BUFFERS_AT + slot * buffer
        struct.pack_into("<HHIII", region, S2C_RING + 128 + 16 * slot, 0, 0, buffer, offset, 0)
    c2s_event = _event()
    for data, ring_fd in (
        (mc.add_region(0, REGION), fd),
        (mc.add_ring(0, 4, True), c2s_event),
        (mc.add_ring(0, log2, False, offset=S2C_RING), _event()),
    ):
        assert client.request(data, ring_fd)[0] == mc.ACK
    assert client.request(mc.message(mc.CONNECT))[0] == mc.CONNECTED
    return client, region, c2s_event


def _s2c_tail(region: mmap.mmap) -> int:
    return int(struct.unpack_from("<H", region, S2C_RING + 64)[0])


def _received(region: mmap.mmap, first: int, last: int) -> list[tuple[list[int], bytes]]:
    """The frames in S2C slots first..last-1: each its descriptors' flags and its bytes."""
    frames: list[tuple[list[int], bytes]] = []
    flags: list[int] = []
    data = b""
    for slot in range(first, last):
        descriptor = S2C_RING + 128 + 16 * slot
        flag, _, length, offset, _ = struct.unpack_from("<HHIII", region, descriptor)
        flags.append(flag)
        data += region[offset : offset + length]
        if not flag & 1:
            frames.append((flags, data))
            flags, data = [], b""
    assert not flags, "a chain left open at the tail"
    return frames


def _until_tail(region: mmap.mmap, wanted: int) -> None:
    deadline = time.monotonic() + 5
    while _s2c_tail(region) != wanted:
        assert time.monotonic() < deadline, f"S2C tail {_s2c_tail(region)}, wanted {wanted}"
        time.sleep(0.01)


def test_a_frame_larger_than_a_buffer_reaches_the_client_chained_or_not_at_all(
    master: Master, jumbo: str
) -> None:
    client, region, _ = _connected(master)
    struct.pack_into("<H", region, S2C_RING + 6, 4)  # four buffers offered
    big = _frame(3000, 1)
    _send_frame(jumbo, big)
    _until_tail(region, 3)
    assert _received(region, 0, 3) == [([1, 1, 0], big)]  # 1024 + 1024 + 952, whole

    # One buffer left: the next jumbo frame is dropped whole (counted), nothing half-written;
    # a frame that fits still goes.
    full_before = master.control.ports()[0].ring_full
    _send_frame(jumbo, _frame(3000, 2))
    _until(lambda: master.control.ports()[0].ring_full == full_before + 1)
    assert _s2c_tail(region) == 3, _received(region, 3, _s2c_tail(region))
    small = _frame(200, 3)
    _send_frame(jumbo, small)
    _until_tail(region, 4)
    assert _received(region, 3, 4) == [([0], small)]
    client.close()


def test_a_chain_is_at_most_64_buffers_long(master: Master, jumbo: str) -> None:
    """Tiny buffers cannot make the master walk a whole ring per frame: a frame needing more
    than 64 is dropped (counted), one needing 63 goes."""
    client, region, _ = _connected(master, log2=7, buffer=64)
    struct.pack_into("<H", region, S2C_RING + 6, 128)  # every buffer offered
    full_before = master.control.ports()[0].ring_full
    _send_frame(jumbo, _frame(64 * 64 + 1, 4))
    _until(lambda: master.control.ports()[0].ring_full == full_before + 1)
    fits = _frame(63 * 64, 5)
    _send_frame(jumbo, fits)
    _until_tail(region, 63)
    assert _received(region, 0, 63) == [([1] * 62 + [0], fits)]
    client.close()


def test_a_chained_frame_from_the_client_reaches_the_kernel_whole(
    master: Master, jumbo: str
) -> None:
    client, region, c2s_event = _connected(master)
    big = _frame(5000, 7)
    capture = _raw(jumbo, "pwtinjpeer",
                   f"s.bind((sys.argv[1],{ETHERTYPE}))\nprint('ready',flush=True)\n"
                   "print(s.recv(65535).hex(),flush=True)")  # fmt: skip
    assert capture.stdout is not None and capture.stdout.readline().strip() == "ready"
    pieces = [big[i : i + 2000] for i in range(0, len(big), 2000)]  # 2000 + 2000 + 1000
    for slot, piece in enumerate(pieces):
        offset = 262144 + slot * 4096
        region[offset : offset + len(piece)] = piece
        flags = 1 if slot < len(pieces) - 1 else 0
        struct.pack_into("<HHIII", region, 128 + 16 * slot, flags, 0, len(piece), offset, 0)
    struct.pack_into("<H", region, 6, len(pieces))  # C2S head
    os.eventfd_write(c2s_event, 1)
    try:
        out, _ = capture.communicate(timeout=10)
    finally:
        capture.kill()
    assert bytes.fromhex(out.strip()) == big
    client.close()


def _until(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)
