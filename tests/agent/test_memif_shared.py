"""The node master's shared path with DPDK testpmd as the CNFs: frames ring to ring between two
shared ports of one domain, back through the tap the moment the agent clears "shared", never
across domains, and hostile receivers that cannot stall the sender or crash the master."""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from podwire.agent import naming
from podwire.config import MemifSettings
from podwire.memif import build as memif_build
from podwire.memif import master as memif_master
from podwire.memif.master import MasterControl, PortSpec, PortStats
from podwire.netlink import HostNetlink, Netlink
from tests.agent import memif_client as mc
from tests.agent.netenv import NetEnv, in_ns
from tests.testpmd import Testpmd, available, memif_vdev

pytestmark = [
    pytest.mark.skipif(memif_build.find() is None, reason="podwire-memif not built"),
    pytest.mark.skipif(not available(), reason="dpdk-testpmd not installed"),
]

SECRET = "shared-path-secret"
MAC_A, MAC_B, MAC_C = "02:00:00:00:0e:01", "02:00:00:00:0e:02", "02:00:00:00:0e:03"
REGION = 1 << 20


class Node:
    """A master with ports on bridges of one namespace, as the agent makes them."""

    def __init__(self, ns: str, work: Path) -> None:
        self.ns, self.work = ns, work
        self.log = work / "master.log"
        binary = memif_build.find()
        assert binary is not None
        control = str(work / "control.sock")
        with open(self.log, "wb") as out:
            self.pid, self.started = memif_master.spawn(
                binary, control, MemifSettings(), stderr=out.fileno()
            )
        self.control = MasterControl(control)

    def add(self, name: str, mac: str, shared: bool, bridge: str = "br0", mtu: int = 1500) -> str:
        socket = str(self.work / f"{name}.sock")
        host = HostNetlink(self.ns)
        try:
            fd = asyncio.run(host.run(Netlink.open_tap, name, mtu, bridge, naming.MARK))
        finally:
            host.close()
        self.control.add(PortSpec(name, socket, SECRET, bridge, shared, mac), fd)
        return socket

    def port(self, name: str) -> PortStats:
        return next(s for s in self.control.ports() if s.name == name)

    def cnf(self, name: str, mac: str, mode: str, *extra: str, cpu: int = 1) -> Testpmd:
        vdev = memif_vdev(str(self.work / f"{name}.sock"), SECRET, mac)
        return Testpmd(vdev, mode, extra, log=self.work / f"{name}-{mode}.log", cpu=cpu)

    def stop(self) -> None:
        self.control.close()
        memif_master.stop(self.pid, self.started)


@pytest.fixture
def node(netenv: NetEnv, tmp_path: Path) -> Iterator[Node]:
    ns = netenv.namespace("ms")
    # IPv6 off, so the kernel sends nothing of its own (MLD, router solicitations) into the
    # rings: a forwarding CNF turns such a frame into one for an unknown MAC, to the tap.
    for conf in ("all", "default"):
        in_ns(ns, "sysctl", "-qw", f"net.ipv6.conf.{conf}.disable_ipv6=1")
    for bridge in ("br0", "br1"):
        in_ns(ns, "ip", "link", "add", bridge, "type", "bridge", "mcast_snooping", "0")
        in_ns(ns, "ip", "link", "set", bridge, "up")
    node = Node(ns, tmp_path)
    try:
        yield node
    finally:
        node.stop()
    assert not memif_master.is_running(node.pid, node.started)


def _until(check: Callable[[], bool], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def _connected(node: Node, *names: str) -> None:
    _until(lambda: all(node.port(n).connected for n in names))


def _txonly(node: Node, name: str, mac: str, to: str, frames: str = "64") -> Testpmd:
    """``frames``: testpmd's --txpkts, the segments of each frame it sends."""
    return node.cnf(name, mac, "txonly", f"--txpkts={frames}", f"--eth-peer=0,{to}", cpu=0)


@contextlib.contextmanager
def _flowing(
    node: Node, receiver_mode: str = "rxonly", sender_frames: str = "64"
) -> Iterator[tuple[Testpmd, Testpmd]]:
    """Shared ports A and B with a txonly CNF on A sending to B's MAC and a CNF in
    ``receiver_mode`` on B, both connected; (receiver, sender), stopped at the end."""
    node.add("pwtsa", MAC_A, shared=True)
    node.add("pwtsb", MAC_B, shared=True)
    receiver = node.cnf("pwtsb", MAC_B, receiver_mode)
    sender = _txonly(node, "pwtsa", MAC_A, MAC_B, sender_frames)
    try:
        receiver.start()
        sender.start()
        _connected(node, "pwtsa", "pwtsb")
        yield receiver, sender
    finally:
        sender.stop()
        receiver.stop()


def _tap_rx(ns: str, name: str) -> int:
    out = in_ns(ns, "cat", f"/sys/class/net/{name}/statistics/rx_packets").stdout
    return int(out)


def test_frames_ring_to_ring_then_back_through_the_tap(node: Node) -> None:
    with _flowing(node):
        _until(lambda: node.port("pwtsb").to_client > 10_000)
        a, b = node.port("pwtsa"), node.port("pwtsb")
        assert a.path == "shared" and a.to_shared > 10_000
        assert a.to_kernel == 0  # B's MAC was known from the start: nothing went to the tap
        tap_before = _tap_rx(node.ns, "pwtsa")

        # The agent clears "shared": once the master answers, no frame moves ring to ring.
        node.control.set_path("pwtsa", False)
        moved = node.port("pwtsa").to_shared
        time.sleep(0.5)
        a = node.port("pwtsa")
        assert a.path == "kernel" and a.to_shared == moved
        assert a.to_kernel > 1_000 and _tap_rx(node.ns, "pwtsa") - tap_before > 1_000
        # ...and the bridge delivers them to B through its tap, the kernel path.
        delivered = node.port("pwtsb").to_client
        _until(lambda: node.port("pwtsb").to_client > delivered + 1_000)
        assert b.to_client <= node.port("pwtsb").to_client

        node.control.set_path("pwtsa", True)
        _until(lambda: node.port("pwtsa").to_shared > moved + 10_000)


def test_a_receiver_that_reconnects_is_reached_ring_to_ring_before_it_sends(node: Node) -> None:
    """A CNF restarted: its port's MAC is still its port's, though the new client (rxonly)
    never sends a frame to be learned from."""
    with _flowing(node) as (receiver, _sender):
        _until(lambda: node.port("pwtsb").to_client > 10_000)
        receiver.stop()
        receiver.start()
        _connected(node, "pwtsb")
        moved, got = node.port("pwtsa").to_shared, node.port("pwtsb").to_client
        _until(lambda: node.port("pwtsb").to_client > got + 10_000)
        assert node.port("pwtsa").to_shared > moved + 10_000


def test_both_ends_must_be_shared_and_in_one_domain(node: Node) -> None:
    node.add("pwtsa", MAC_A, shared=True)
    node.add("pwtsb", MAC_B, shared=False)  # port security on: its frames are filtered
    node.add("pwtsc", MAC_C, shared=True, bridge="br1")  # another network
    receivers = [node.cnf(n, m, "rxonly") for n, m in (("pwtsb", MAC_B), ("pwtsc", MAC_C))]
    senders = [_txonly(node, "pwtsa", MAC_A, MAC_B)]
    try:
        for pmd in receivers + senders:
            pmd.start()
        _connected(node, "pwtsa", "pwtsb", "pwtsc")
        _until(lambda: node.port("pwtsa").to_kernel > 10_000)
        assert node.port("pwtsa").to_shared == 0
        senders[0].stop()
        senders[0] = _txonly(node, "pwtsa", MAC_A, MAC_C)
        senders[0].start()
        _connected(node, "pwtsa")
        sent = node.port("pwtsa").to_kernel
        _until(lambda: node.port("pwtsa").to_kernel > sent + 10_000)
        assert node.port("pwtsa").to_shared == 0
        # br1 never sees br0's frames; only its own IPv6 chatter (router/MLD solicitations).
        assert node.port("pwtsc").to_client < 100
    finally:
        for pmd in senders + receivers:
            pmd.stop()


def _hostile_receiver(node: Node, name: str, offset: int) -> mc.Client:
    """A client whose S2C ring offers one buffer at ``offset`` of its own 1 MiB region
    (outside it when ``offset`` is past the end) and is never drained."""
    client = mc.Client(node.work.joinpath(f"{name}.sock").as_posix())
    assert client.recv()[0] == mc.HELLO
    assert client.request(mc.init(SECRET))[0] == mc.ACK
    fd = mc.region_fd(REGION)
    region = mmap.mmap(fd, REGION)
    for ring in (0, 4096):
        struct.pack_into("<I", region, ring, mc.COOKIE)
    assert client.request(mc.add_region(0, REGION), fd)[0] == mc.ACK
    assert client.request(mc.add_ring(0, 4, True), os.eventfd(0))[0] == mc.ACK
    assert client.request(mc.add_ring(0, 4, False, offset=4096), os.eventfd(0))[0] == mc.ACK
    struct.pack_into("<HHIII", region, 4096 + 128, 0, 0, 2048, offset, 0)
    struct.pack_into("<H", region, 4096 + 6, 1)  # S2C head: one buffer offered
    assert client.request(mc.message(mc.CONNECT))[0] == mc.CONNECTED
    client.region = region  # type: ignore[attr-defined]
    return client


@pytest.mark.parametrize("offset", [8192, REGION + 4096], ids=["never-drains", "outside-region"])
def test_a_hostile_receiver_stalls_nobody(node: Node, offset: int) -> None:
    """B offers one buffer and never drains (or one outside its region): A's frames to B are
    dropped at B (ring_full), A's frames to the kernel go on, the master stays up."""
    node.add("pwtsa", MAC_A, shared=True)
    node.add("pwtsb", MAC_B, shared=True)
    hostile = _hostile_receiver(node, "pwtsb", offset)
    sender = _txonly(node, "pwtsa", MAC_A, MAC_B)
    try:
        sender.start()
        _connected(node, "pwtsa")
        _until(lambda: node.port("pwtsb").ring_full > 10_000)
        b = node.port("pwtsb")
        assert b.to_client == (1 if offset < REGION else 0)
        # A's traffic is not held back: a broadcast to the kernel still flows meanwhile.
        sender.stop()
        sender = _txonly(node, "pwtsa", MAC_A, "ff:ff:ff:ff:ff:ff")
        sender.start()
        _connected(node, "pwtsa")
        sent = node.port("pwtsa").to_kernel
        _until(lambda: node.port("pwtsa").to_kernel > sent + 10_000)
        assert memif_master.is_running(node.pid, node.started)
        assert node.port("pwtsb").connected
    finally:
        sender.stop()
        hostile.close()


def test_cnf_restart_on_the_shared_path(node: Node) -> None:
    with _flowing(node) as (receiver, _):
        _until(lambda: node.port("pwtsb").to_client > 10_000)
        receiver.stop()  # killed: the master drops its frames meanwhile, and goes on
        _until(lambda: not node.port("pwtsb").connected)
        full = node.port("pwtsb").ring_full
        got = node.port("pwtsb").to_client
        receiver.start()
        _connected(node, "pwtsb")
        _until(lambda: node.port("pwtsb").to_client > got + 10_000)
        assert node.port("pwtsb").connects == 2
        assert node.port("pwtsb").ring_full >= full


@pytest.mark.parametrize("mode", ["io", "macswap"])
def test_a_forwarding_cnf_on_the_shared_path(node: Node, mode: str) -> None:
    """B sends back out of its port what it gets: macswap turns A's frames around, and they
    reach A ring to ring (A, a txonly testpmd, never drains, so most are its ring_full); io
    keeps their destination, B's own MAC, which never loops back into B's ring: the tap."""
    with _flowing(node, mode):
        _until(lambda: node.port("pwtsb").from_client > 10_000)
        if mode == "macswap":
            _until(lambda: node.port("pwtsa").ring_full > 10_000)
            a, b = node.port("pwtsa"), node.port("pwtsb")
            assert a.to_client > 0 and b.to_kernel == 0
        else:
            b = node.port("pwtsb")
            assert b.to_shared == 0 and b.to_kernel > 10_000


def test_jumbo_frames_both_ways_on_both_paths(node: Node, netenv: NetEnv) -> None:
    """Frames larger than DPDK's 2 KiB memif buffers travel chained: a 9000-byte-MTU pod pings
    an icmpecho CNF through the kernel path with 8000-byte payloads (the kernel checks every
    reply's checksum over the whole payload), and 3000-byte frames go ring to ring."""
    in_ns(node.ns, "ip", "link", "set", "br0", "mtu", "9000")
    node.add("pwtsj", MAC_C, shared=False, mtu=9000)
    pod = netenv.namespace("jp")
    in_ns(node.ns, "ip", "link", "add", "pwtjumbo", "mtu", "9000", "type", "veth", "peer",
          "name", "eth0", "mtu", "9000", "netns", pod)  # fmt: skip
    in_ns(node.ns, "ip", "link", "set", "pwtjumbo", "master", "br0", "up")
    in_ns(pod, "ip", "addr", "add", "10.88.7.2/24", "dev", "eth0")
    in_ns(pod, "ip", "link", "set", "eth0", "up")
    echo = node.cnf("pwtsj", MAC_C, "icmpecho")
    try:
        echo.start()
        _connected(node, "pwtsj")
        ping = ["ping", "-c", "3", "-i", "0.2", "-W", "2", "-M", "do", "-s", "8000", "10.88.7.9"]
        _until(lambda: in_ns(pod, *ping, check=False).returncode == 0)
        assert node.port("pwtsj").bad == 0
    finally:
        echo.stop()

    with _flowing(node, sender_frames="2000,1000"):
        _until(lambda: node.port("pwtsb").to_client > 10_000)
        assert node.port("pwtsa").to_shared > 10_000 and node.port("pwtsa").bad == 0
