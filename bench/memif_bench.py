"""memif data path: a testpmd CNF through podwire's master into a bridge, vs the kernel path.

Throughput: testpmd ``txonly`` sends 64-byte frames to a veth pod's MAC, (a) as a memif client
of a ``podwire-memif`` master whose tap is on the bridge, (b) through DPDK's ``net_af_packet``
on a veth whose other end is on the same bridge (what a CNF would use without memif). The
frames are counted at the veth pod (its interface's rx_packets), in 0.5 s windows; the rows
are kpps, so here a ratio above 1 means memif is faster (target >= 0.5x).

Latency: ping RTT from the veth pod to a testpmd ``icmpecho`` CNF on memif, vs to a second
veth pod on the same bridge (target p50 <= 2x). testpmd busy-polls one CPU while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.stats import cpu_seconds, row
from podwire.agent import naming
from podwire.config import MemifSettings
from podwire.memif import build as memif_build
from podwire.memif import master as memif_master
from podwire.netlink import HostNetlink, Netlink
from tests.testpmd import Testpmd, available, memif_vdev

WINDOW = 0.5
WARMUP = 2.0
SINK_MAC = "02:00:00:00:0b:01"
CNF_MAC = "02:00:00:00:0c:01"
# The shared-path CNFs use 2^14-slot rings: with three busy processes on two cores a ring
# must cover a scheduler slice of the receiver (1,024 slots are 0.5 ms at 2 Mpps).
RSIZE = 14
SHARED_A, SHARED_B = "02:00:00:00:0d:01", "02:00:00:00:0d:02"
SECRET = "bench-secret"
# The RTT CNF runs at a higher priority for its few seconds: a CNF has a core of its own in
# production; on this shared VM a busy-polling testpmd at normal priority waits milliseconds
# for the CPU whenever other work runs, and the row would measure the scheduler instead.
CNF_NICE = -10


def _sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


class Topology:
    """A host namespace with a bridge, two veth pods and a veth for the af_packet reference."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:5]
        self.host, self.sink, self.peer = f"pwb{tag}h", f"pwb{tag}s", f"pwb{tag}p"
        try:
            self._build()
        except BaseException:
            self.remove()
            raise

    def _build(self) -> None:
        for ns in (self.host, self.sink, self.peer):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", self.host, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.host, "link", "set", "br0", "up")
        self._pod(self.sink, "vsink", SINK_MAC, "10.99.0.10/24")
        self._pod(self.peer, "vpeer", "02:00:00:00:0b:02", "10.99.0.11/24")
        _sh("ip", "-n", self.host, "link", "add", "vaf", "type", "veth", "peer", "vafbr")
        for name in ("vaf", "vafbr"):
            _sh("ip", "-n", self.host, "link", "set", name, "up")
        _sh("ip", "-n", self.host, "link", "set", "vafbr", "master", "br0")
        # A static entry: txonly frames go to the sink without the bridge flooding them.
        _sh("ip", "netns", "exec", self.host, "bridge", "fdb", "replace", SINK_MAC, "dev", "vsink",
            "master", "static")  # fmt: skip

    def _pod(self, ns: str, host_end: str, mac: str, address: str) -> None:
        _sh("ip", "-n", self.host, "link", "add", host_end, "type", "veth", "peer", "eth0",
            "netns", ns)  # fmt: skip
        _sh("ip", "-n", self.host, "link", "set", host_end, "master", "br0", "up")
        _sh("ip", "-n", ns, "link", "set", "eth0", "address", mac, "up")
        _sh("ip", "-n", ns, "addr", "add", address, "dev", "eth0")

    def received(self) -> int:
        out = _sh("ip", "-n", self.sink, "-s", "-j", "link", "show", "eth0")
        return int(json.loads(out)[0]["stats64"]["rx"]["packets"])

    def remove(self) -> None:
        for ns in (self.host, self.sink, self.peer):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


class Master:
    """The node's master, with the ports the bench needs, started the way the agent starts it:
    ``pwtbench`` on the kernel path, and ``pwtsa``/``pwtsb`` on the shared path."""

    def __init__(self, topo: Topology, work: Path) -> None:
        binary = memif_build.find()
        if binary is None:
            raise RuntimeError("podwire-memif is not built: run scripts/setup")
        control = str(work / "control.sock")
        self.pid, self.started = memif_master.spawn(binary, control, MemifSettings())
        self.control = memif_master.MasterControl(control)
        self.sockets: dict[str, str] = {}
        host = HostNetlink(topo.host)
        try:
            for name, shared, mac in (
                ("pwtbench", False, CNF_MAC), ("pwtsa", True, SHARED_A), ("pwtsb", True, SHARED_B),
            ):  # fmt: skip
                self.sockets[name] = str(work / f"{name}.sock")
                fd = asyncio.run(host.run(Netlink.open_tap, name, 1500, "br0", naming.MARK))
                spec = memif_master.PortSpec(name, self.sockets[name], SECRET, "br0", shared, mac)
                self.control.add(spec, fd)
        except BaseException:
            self.stop()
            raise
        finally:
            host.close()

    def client(self, name: str, mac: str, log2_ring: int | None = None) -> str:
        return memif_vdev(self.sockets[name], SECRET, mac, log2_ring)

    def port(self, name: str) -> memif_master.PortStats:
        return next(s for s in self.control.ports() if s.name == name)

    def stop(self) -> None:
        self.control.close()
        memif_master.stop(self.pid, self.started)
        for path in self.sockets.values():
            memif_master.remove_socket(path)


def _busy_cpu_seconds() -> float:
    """CPU seconds the whole machine spent busy (every core), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Windows:
    """Per 0.5 s window: frames counted at the receiver (kpps), the machine's busy cores per
    Mpps moved, and frames dropped per second."""

    kpps: list[float] = field(default_factory=list)
    cores_per_mpps: list[float] = field(default_factory=list)
    drops: list[float] = field(default_factory=list)


@contextlib.contextmanager
def _running(pmds: list[Testpmd]) -> Iterator[None]:
    """The testpmds started, in order, and warmed up; stopped after the block."""
    for pmd in pmds:
        pmd.start()
    try:
        time.sleep(WARMUP)
        yield
    finally:
        for pmd in pmds:
            pmd.stop()


def _measure(count: Callable[[], tuple[int, int]], pmds: list[Testpmd], windows: int) -> Windows:
    """``count`` gives (frames received, frames dropped) so far."""
    with _running(pmds):
        out = Windows()
        (got, dropped), busy, at = count(), _busy_cpu_seconds(), time.perf_counter()
        for _ in range(windows):
            time.sleep(WINDOW)
            now_got, now_dropped = count()
            now_busy, now = _busy_cpu_seconds(), time.perf_counter()
            seconds = now - at
            rate = (now_got - got) / seconds
            out.kpps.append(rate / 1000.0)
            if rate:
                out.cores_per_mpps.append((now_busy - busy) / seconds / (rate / 1e6))
            out.drops.append((now_dropped - dropped) / seconds)
            got, dropped, busy, at = now_got, now_dropped, now_busy, now
        return out


def _txonly(vdev: str, to: str = SINK_MAC, cpu: int = 1) -> Testpmd:
    return Testpmd(vdev, "txonly", ("--txpkts=64", f"--eth-peer=0,{to}"), cpu=cpu)


def _rtts(ns: str, address: str, count: int) -> list[float]:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "ping", "-c", str(count), "-i", "0.01", "-W", "1", address],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [float(m) for m in re.findall(r"time=([0-9.]+) ms", out)]


def run(stack: Any, samples: int) -> list[dict[str, Any]]:
    if not available():
        return []
    windows = max(5, min(samples // 10, 20))
    topo = Topology()
    with tempfile.TemporaryDirectory(prefix="pwm-", dir="/tmp") as tmp:
        master = Master(topo, Path(tmp))
        try:
            return _throughput(topo, master, windows) + _latency(topo, master, samples)
        finally:
            master.stop()
            topo.remove()


def _throughput(topo: Topology, master: Master, windows: int) -> list[dict[str, Any]]:
    def at_sink() -> tuple[int, int]:
        return topo.received(), 0

    def at_b() -> tuple[int, int]:
        b = master.port("pwtsb")
        return b.to_client, b.ring_full

    kernel = _measure(at_sink, [_txonly(master.client("pwtbench", CNF_MAC))], windows)
    ref = _txonly("net_af_packet0,iface=vaf")
    ref.netns = topo.host
    packet = _measure(at_sink, [ref], windows)
    # One core each side: the sender on CPU 0, the receiver on CPU 1; the master shares them.
    sender = _txonly(master.client("pwtsa", SHARED_A, RSIZE), to=SHARED_B, cpu=0)
    receiver = Testpmd(master.client("pwtsb", SHARED_B, RSIZE), "rxonly", cpu=1)
    shared = _measure(at_b, [receiver, sender], windows)
    idle = _idle_master(
        master,
        [
            Testpmd(master.client(n, m), "rxonly", cpu=c)
            for n, m, c in (("pwtsa", SHARED_A, 0), ("pwtsb", SHARED_B, 1))
        ],
    )
    ref_name = "testpmd net_af_packet on a veth"
    return [
        row("memif kernel path: 64 B testpmd -> master -> tap -> bridge -> veth pod (kpps)",
            kernel.kpps, ref_name, packet.kpps, unit="kpps"),
        row("memif shared path: 64 B testpmd -> master -> testpmd, same network (kpps)",
            shared.kpps, ref_name, packet.kpps, unit="kpps"),
        row("memif kernel path: busy cores per Mpps (whole machine)", kernel.cores_per_mpps,
            ref_name, packet.cores_per_mpps, unit="cores/Mpps"),
        row("memif shared path: busy cores per Mpps (whole machine)", shared.cores_per_mpps,
            ref_name, packet.cores_per_mpps, unit="cores/Mpps"),
        row("memif shared path: frames dropped per second (receiver's ring full)", shared.drops,
            unit="frames/s"),
        row("memif master idle, two CNFs connected: % of one core", idle, unit="%"),
    ]  # fmt: skip


def _idle_master(master: Master, pmds: list[Testpmd]) -> list[float]:
    with _running(pmds):
        samples = []
        for _ in range(6):
            before, at = cpu_seconds(master.pid), time.perf_counter()
            time.sleep(WINDOW)
            samples.append(100.0 * (cpu_seconds(master.pid) - before) / (time.perf_counter() - at))
        return samples


def _latency(topo: Topology, master: Master, samples: int) -> list[dict[str, Any]]:
    count = max(20, min(samples, 200))
    with _running([Testpmd(master.client("pwtbench", CNF_MAC), "icmpecho", nice=CNF_NICE)]):
        memif_rtt = _rtts(topo.sink, "10.99.0.99", count)
    veth_rtt = _rtts(topo.sink, "10.99.0.11", count)
    return [
        row("memif: ping RTT veth pod -> memif CNF (testpmd icmpecho)", memif_rtt,
            "veth pod -> veth pod", veth_rtt),
    ]  # fmt: skip
