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
import json
import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.stats import row
from podwire.agent import memif_master, naming
from podwire.config import MemifSettings
from podwire.demo.testpmd import Testpmd, available
from podwire.memif import build as memif_build
from podwire.netlink import HostNetlink, Netlink

WINDOW = 0.5
WARMUP = 2.0
SINK_MAC = "02:00:00:00:0b:01"
CNF_MAC = "02:00:00:00:0c:01"
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
    """podwire's master on a tap on the bridge, started the way the agent starts it."""

    def __init__(self, topo: Topology, work: Path) -> None:
        binary = memif_build.find()
        if binary is None:
            raise RuntimeError("podwire-memif is not built: run scripts/setup")
        self.socket = str(work / "memif.sock")
        host = HostNetlink(topo.host)
        try:
            fd = asyncio.run(host.run(Netlink.open_tap, "pwtbench", 1500, "br0", naming.MARK))
        finally:
            host.close()
        spec = memif_master.MasterSpec("bench", self.socket, SECRET)
        self.pid, self.started = memif_master.spawn(binary, spec, fd, MemifSettings())

    def stop(self) -> None:
        memif_master.stop(self.pid, self.started)
        memif_master.remove_socket(self.socket)


def _pps_windows(topo: Topology, pmd: Testpmd, windows: int) -> list[float]:
    pmd.start()
    try:
        time.sleep(WARMUP)
        samples, last, at = [], topo.received(), time.perf_counter()
        for _ in range(windows):
            time.sleep(WINDOW)
            now_count, now = topo.received(), time.perf_counter()
            samples.append((now_count - last) / (now - at) / 1000.0)
            last, at = now_count, now
        return samples
    finally:
        pmd.stop()


def _txonly(vdev: str) -> Testpmd:
    return Testpmd(vdev, "txonly", ("--txpkts=64", f"--eth-peer=0,{SINK_MAC}"))


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
            client = (
                f"net_memif0,role=client,socket={master.socket},socket-abstract=no,"
                f"secret={SECRET},mac={CNF_MAC}"
            )
            memif_pps = _pps_windows(topo, _txonly(client), windows)
            ref = _txonly("net_af_packet0,iface=vaf")
            ref.netns = topo.host
            kernel_pps = _pps_windows(topo, ref, windows)
            echo = Testpmd(client, "icmpecho", nice=CNF_NICE)
            echo.start()
            try:
                time.sleep(WARMUP)
                count = max(20, min(samples, 200))
                memif_rtt = _rtts(topo.sink, "10.99.0.99", count)
            finally:
                echo.stop()
            veth_rtt = _rtts(topo.sink, "10.99.0.11", count)
        finally:
            master.stop()
            topo.remove()
    return [
        row("memif: 64 B frames testpmd -> podwire memif -> bridge -> veth pod (kpps)",
            memif_pps, "testpmd net_af_packet on a veth", kernel_pps, unit="kpps"),
        row("memif: ping RTT veth pod -> memif CNF (testpmd icmpecho)", memif_rtt,
            "veth pod -> veth pod", veth_rtt),
    ]  # fmt: skip
