"""memif data path: a testpmd CNF through podwire's master into a bridge, vs the kernel path.

Throughput: testpmd ``txonly`` sends 64-byte frames to a veth pod's MAC, (a) as a memif client
of a ``podwire-memif`` master whose tap is on the bridge, (b) through DPDK's ``net_af_packet``
on a veth whose other end is on the same bridge (what a CNF would use without memif). The
frames are counted at the veth pod (its interface's rx_packets), in 0.5 s windows; the rows
are kpps, so here a ratio above 1 means memif is faster (target >= 0.5x).

Security groups in the master (#38): the same CNF -> CNF run with both ports' classifiers in
force (port security on, 10 stateful rules, the frames' rule last), against af_packet (target
>= 5x) and against the shared path without rules (target >= 0.8x); and a rule created through
Neutron until the agent's enforcer pass that puts it in the master's classifier is confirmed
(target p99 <= 50 ms).

Latency: ping RTT from the veth pod to a testpmd ``icmpecho`` CNF on memif, vs to a second
veth pod on the same bridge (target p50 <= 2x). testpmd busy-polls one CPU while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import sg_bench
from bench.harness import delete_project, forget_nodes, running, stack_etcd
from bench.stats import cpu_seconds, row
from podwire.agent import naming
from podwire.agent.policy.enforcer import EnforcerSettings, PolicyEnforcer
from podwire.config import MemifSettings
from podwire.memif import build as memif_build
from podwire.memif import master as memif_master
from podwire.netfilter import Nftables
from podwire.netlink import HostNetlink, Netlink
from podwire.neutron.client import neutron_connection
from podwire.schema.ports import DesiredPort, FixedIp
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy.classifier import UNFILTERED, compile_classifier, encode
from podwire.sgpolicy.compile import PolicyInputs
from tests.agent.memif_client import RingClient
from tests.agent.ndframes import checksum
from tests.agent.netenv import NetEnv
from tests.agent.sgnet import numbered_ports
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
# testpmd txonly's own addresses (198.18.0.1 -> .2, UDP 9 -> 9): the filtered run sends the
# very frames the unfiltered one does.
SHARED_IPS = {SHARED_A: "198.18.0.1", SHARED_B: "198.18.0.2"}
BENCH_NET = "198.18.0.0/24"
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


PORTS = (("pwtbench", False, CNF_MAC), ("pwtsa", True, SHARED_A), ("pwtsb", True, SHARED_B))


class Master:
    """The node's master, with the ports the bench needs, started the way the agent starts it:
    by default ``pwtbench`` on the kernel path, and ``pwtsa``/``pwtsb`` on the shared path."""

    def __init__(
        self,
        topo: Topology,
        work: Path,
        ports: tuple[tuple[str, bool, str], ...] = PORTS,
        settings: MemifSettings | None = None,
    ) -> None:
        settings = settings or MemifSettings()
        binary = memif_build.find()
        if binary is None:
            raise RuntimeError("podwire-memif is not built: run scripts/setup")
        control = str(work / "control.sock")
        self.pid, self.started = memif_master.spawn(binary, control, settings)
        self.control = memif_master.MasterControl(control)
        self.sockets: dict[str, str] = {}
        host = HostNetlink(topo.host)
        try:
            for name, shared, mac in ports:
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
            rows = _throughput(topo, master, windows) + _latency(topo, master, samples)
            rows += asyncio.run(_rule_to_master(stack, master, min(samples, 30)))
        finally:
            master.stop()
        try:
            return rows + _flow_table(topo, Path(tmp))
        finally:
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
    filtered = _filtered(master, at_b, windows)
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
        row("memif shared path, port security on, 10 stateful rules in the master (kpps)",
            filtered.kpps, ref_name, packet.kpps, unit="kpps"),
        row("memif shared path: 10 stateful rules in the master vs none (kpps)",
            filtered.kpps, "the shared path without rules", shared.kpps, unit="kpps"),
        row("memif master idle, two CNFs connected: % of one core", idle, unit="%"),
    ]  # fmt: skip


def _group() -> SecurityGroup:
    """10 stateful rules: eight ingress port ranges txonly's frames miss, then its UDP port 9
    from its network, and egress open."""
    rules = [
        Rule(str(uuid.uuid4()), "ingress", "IPv4", 6 if i % 2 else 17, 1000 + 10 * i,
             1005 + 10 * i, BENCH_NET)
        for i in range(8)
    ]  # fmt: skip
    rules.append(Rule(str(uuid.uuid4()), "ingress", "IPv4", 17, 9, 9, BENCH_NET))
    rules.append(Rule(str(uuid.uuid4()), "egress", "IPv4"))
    return SecurityGroup(str(uuid.uuid4()), tuple(rules))


def _bench_port(mac: str, groups: tuple[str, ...]) -> DesiredPort:
    address = FixedIp(SHARED_IPS[mac], "bench-subnet", BENCH_NET, None)
    return DesiredPort(str(uuid.uuid4()), "bench-net", mac, 1500, "vxlan", None, 1, "memif",
                       (address,), groups)  # fmt: skip


def _filtered(master: Master, at_b: Callable[[], tuple[int, int]], windows: int) -> Windows:
    """The shared run again with both ports' classifiers in force, then cleared."""
    group = _group()
    inputs = PolicyInputs(groups={group.sg_id: group})
    for name, mac in (("pwtsa", SHARED_A), ("pwtsb", SHARED_B)):
        blob = encode(compile_classifier(inputs, _bench_port(mac, (group.sg_id,))))
        master.control.set_policy(name, blob)
    try:
        sender = _txonly(master.client("pwtsa", SHARED_A, RSIZE), to=SHARED_B, cpu=0)
        receiver = Testpmd(master.client("pwtsb", SHARED_B, RSIZE), "rxonly", cpu=1)
        found = _measure(at_b, [receiver, sender], windows)
        a, b = master.port("pwtsa"), master.port("pwtsb")
        if not a.admitted or a.denied or b.denied or a.spoofed or a.invalid:
            raise RuntimeError(f"the classifiers did not admit the bench's frames: {a} {b}")
        return found
    finally:
        for name in ("pwtsa", "pwtsb"):
            master.control.set_policy(name, encode(UNFILTERED))


class MasterPush:
    """The enforcer's ``MasterFilters`` for ports of the bench's master: each classifier the
    pass compiles goes to the master and is confirmed, as the agent's memif service does."""

    def __init__(self, master: Master, ports: set[str]) -> None:
        self._master, self._ports = master, ports

    def filtered_here(self, ifname: str) -> bool:
        return ifname in self._ports

    async def install(self, ifname: str, blob: bytes | None, why: str) -> None:
        if blob is None:
            raise RuntimeError(f"{ifname}: {why}")
        await asyncio.to_thread(self._master.control.set_policy, ifname, blob)


async def _rule_to_master(stack: Any, master: Master, samples: int) -> list[dict[str, Any]]:
    """Neutron rule create -> the enforcer's pass with it confirmed by the master, for a node
    with one memif port among 20 in the group (the real forwarder feeds the stack's etcd)."""
    conn = neutron_connection(stack["neutron"])
    project, env = uuid.uuid4().hex, NetEnv()
    etcd = await stack_etcd(stack)
    nft = Nftables(env.namespace("mfr"))
    host = f"{env.tag}-mfr"
    enforcer = PolicyEnforcer(etcd, nft, EnforcerSettings(host), None)
    enforcer.filters = MasterPush(master, {"pwtsa"})
    times, api = [], []
    try:
        sg = conn.network.create_security_group(name="pw-bench-memif", project_id=project)
        ports = [(_bench_port(SHARED_A, (sg.id,)), "pwtsa")]
        ports += numbered_ports(19, (sg.id,))
        async with running(enforcer.run()):
            enforcer.adopt(ports)
            await enforcer.synced.wait()
            for i in range(samples):
                took, call = await sg_bench.rule_create_in_force(conn, enforcer, sg.id, 3000 + i)
                times.append(took)
                api.append(call)
    finally:
        master.control.set_policy("pwtsa", encode(UNFILTERED))
        nft.close()
        delete_project(conn, project)
        await forget_nodes(etcd, host)
        await etcd.close()
        env.cleanup()
    return [
        row("memif: Neutron rule create returned -> in force in the master (confirmed)",
            times, "the Neutron rule create call", api),
    ]  # fmt: skip


FLOWS = 100_000


def _flow_table(topo: Topology, work: Path) -> list[dict[str, Any]]:
    """A master with the default flow table: 100,000 UDP flows opened from one filtered port
    to another (Python clients), then one more, which finds the table full and takes the
    place of the oldest flow never replied to; the master's resident memory with the table
    full, next to what it says its table takes."""
    master = Master(topo, work, (("pwtfa", True, SHARED_A), ("pwtfb", True, SHARED_B)),
                    MemifSettings(max_flows=FLOWS))  # fmt: skip
    try:
        group = SecurityGroup(str(uuid.uuid4()), (
            Rule(str(uuid.uuid4()), "ingress", "IPv4", 17, 1, 65535, BENCH_NET),
            Rule(str(uuid.uuid4()), "egress", "IPv4"),
        ))  # fmt: skip
        inputs = PolicyInputs(groups={group.sg_id: group})
        for name, mac in (("pwtfa", SHARED_A), ("pwtfb", SHARED_B)):
            blob = encode(compile_classifier(inputs, _bench_port(mac, (group.sg_id,))))
            master.control.set_policy(name, blob)
        sender = RingClient(master.sockets["pwtfa"], SECRET)
        receiver = RingClient(master.sockets["pwtfb"], SECRET)
        try:
            started = time.perf_counter()
            for flow in range(FLOWS + 1):
                sender.send(_udp_frame(1024 + flow // 2, 9 + flow % 2))
            _drained(master, "pwtfa", FLOWS + 1)
            seconds = time.perf_counter() - started
        finally:
            sender.close()
            receiver.close()
        a = master.port("pwtfa")
        if (a.admitted, a.flows_full) != (FLOWS + 1, 0):
            raise RuntimeError(f"{FLOWS} flows then one more: admitted, full = {a}")
        rss = _rss_mib(master.pid)
    finally:
        master.stop()
    return [
        row(f"memif master resident memory, {FLOWS:,} flows tracked (table full)",
            [rss], "its flow table as the master states it (at start: flow_table_bytes)",
            [FLOW_TABLE_BYTES / 2**20], unit="MiB"),
        row(f"memif: {FLOWS:,} new flows through the master from a Python client (flows/s)",
            [(FLOWS + 1) / seconds], unit="flows/s"),
    ]  # fmt: skip


# What the master logs as flow_table_bytes for --max-flows=100000 (64 bytes a flow, 4 a bucket).
FLOW_TABLE_BYTES = 6_924_288


def _udp_frame(sport: int, dport: int) -> bytes:
    """testpmd's addresses, A to B, UDP without a checksum (IPv4 allows it)."""
    eth = bytes.fromhex(SHARED_B.replace(":", "") + SHARED_A.replace(":", "")) + b"\x08\x00"
    src, dst = (ipaddress.IPv4Address(SHARED_IPS[m]).packed for m in (SHARED_A, SHARED_B))
    head = struct.pack("!BBHHHBBH", 0x45, 0, 28, 0, 0, 64, 17, 0) + src + dst
    head = head[:10] + struct.pack("!H", checksum(head)) + head[12:]
    return eth + head + struct.pack("!HHHH", sport, dport, 8, 0)


def _drained(master: Master, name: str, frames: int) -> None:
    deadline = time.monotonic() + 60
    while master.port(name).from_client < frames:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the master read {master.port(name).from_client} of {frames}")
        time.sleep(0.01)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


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
