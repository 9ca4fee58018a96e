"""Pod sandboxes through containerd's CRI, as a new node runs them: podwire vs bridge+host-local.

One private containerd 1.6 (``podwire/kube/containerd.py``) runs in a simulated host namespace
and serves both conflists in turn, alternating (and swapping which goes first) by round so
drift of this noisy VM hits both alike. podwire is the whole system a node pays for: the
controller process (VIF API, its pool for this node pre-populated with 32 ports in one
security group), the agent process on the controller's VIF source enforcing that group, and
the conflist ``podwire cni install`` writes. The stack's Neutron binds the ports and its ml2
driver journals them to the agent. Before each round of either conflist the pool is back to
a burst's worth of ready ports (released ports recycled) and has stopped changing, as on a
node between bursts, so no refill's Neutron work lands in the next round. One unrecorded
warm-up round each comes first: containerd's caches, and the pool's first top-up after a
burst (it learns the node's burst then; later bursts are served from recycled ports).

Rows: RunPodSandbox one at a time; 30 RunPodSandbox at once (wall, and each call's time);
30 StopPodSandbox + RemovePodSandbox at once (wall).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openstack.exceptions import ConflictException

from bench.cni_bench import _unpublish
from bench.harness import delete_project, project_network
from bench.stats import row, timed
from podwire.cni.install import InstallSpec, conflist, install
from podwire.demo.services import Services
from podwire.errors import StackError
from podwire.kube.containerd import Containerd
from podwire.neutron.client import neutron_connection
from tests.agent.netenv import NetEnv
from tests.cri.cri import Cri, Pod, write_conflist

BURST = 30
POOL = 32
ROUNDS = 6
VTEP = "192.0.2.1"
STEADY = 2.0  # seconds the pool and its ports must stay unchanged before a round


def _reference(work: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "reference",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "pwbcri0",
                "ipam": {
                    "type": "host-local",
                    "subnet": "10.97.0.0/16",
                    "dataDir": str(work / "ipam"),
                },
            }
        ],
    }


@dataclass
class Phase:
    """One conflist's samples; ``singles``: one-at-a-time sandboxes per round."""

    body: dict[str, Any]
    singles: int
    run: list[float] = field(default_factory=list)
    burst: list[float] = field(default_factory=list)
    burst_calls: list[float] = field(default_factory=list)
    teardown: list[float] = field(default_factory=list)


async def _timed_run(cri: Cri, pod: Pod) -> tuple[str, float]:
    started = time.perf_counter()
    sandbox = await cri.run(pod)
    return sandbox, (time.perf_counter() - started) * 1000


async def _gone(cri: Cri, sandboxes: list[str]) -> float:
    async def one(sandbox: str) -> None:
        await cri.stop(sandbox)
        await cri.remove(sandbox)

    return await timed(asyncio.gather, *(one(s) for s in sandboxes))


async def _round(
    containerd: Containerd, cri: Cri, phase: Phase, settle: Callable[[], None], tag: str
) -> None:
    write_conflist(containerd.conf_dir, phase.body)
    await cri.wait_loaded(phase.body)
    await asyncio.to_thread(settle)
    for i in range(phase.singles):
        sandbox, took = await _timed_run(cri, Pod.new(f"{tag}-s{i}"))
        phase.run.append(took)
        await _gone(cri, [sandbox])
    await asyncio.to_thread(settle)
    started = time.perf_counter()
    runs = await asyncio.gather(*(_timed_run(cri, Pod.new(f"{tag}-b{i}")) for i in range(BURST)))
    phase.burst.append((time.perf_counter() - started) * 1000)
    phase.burst_calls.extend(took for _, took in runs)
    phase.teardown.append(await _gone(cri, [sandbox for sandbox, _ in runs]))


async def _measure(
    containerd: Containerd, ours: Phase, ref: Phase, settle: Callable[[], None]
) -> None:
    cri = Cri(containerd.socket)
    try:
        for name, phase in (("pw", ours), ("ref", ref)):  # warm-ups, not recorded
            await _round(containerd, cri, Phase(phase.body, 1), settle, f"{name}-warm")
        for round_ in range(ROUNDS):
            first, second = (ours, ref) if round_ % 2 == 0 else (ref, ours)  # no order bias
            for phase in (first, second):
                name = "pw" if phase is ours else "ref"
                await _round(containerd, cri, phase, settle, f"{name}{round_}")
    finally:
        await cri.remove_all()
        await cri.close()


def _rows(ours: Phase, ref: Phase) -> list[dict[str, Any]]:
    return [
        row(name, mine, "bridge+host-local, same containerd", theirs)
        for name, mine, theirs in (
            ("CRI RunPodSandbox (whole system, pooled port, SGs)", ours.run, ref.run),
            (f"CRI {BURST} RunPodSandbox at once, wall", ours.burst, ref.burst),
            (f"CRI {BURST} RunPodSandbox at once, each call", ours.burst_calls, ref.burst_calls),
            (
                f"CRI {BURST} StopPodSandbox+RemovePodSandbox at once, wall",
                ours.teardown,
                ref.teardown,
            ),
        )
    ]


class PodwireNode:
    """The controller and agent of one simulated node, a pooled network in one group."""

    def __init__(self, stack: dict[str, Any], work: Path, host: str, host_ns: str) -> None:
        self.conn = neutron_connection(stack["neutron"])
        self.services = Services(work, stack["etcd"], stack["neutron"], log_level="INFO")
        self.host, self.host_ns = host, host_ns
        self.project = uuid.uuid4().hex
        self.network: Any = None
        self.group: Any = None
        self.socket = ""
        self.settle_groups: list[str] | None = None  # settle counts only this set's ports

    def start(self, vtep: str = VTEP, agent_extra: str = "") -> None:
        """The network (no DHCP: no port of Neutron's own), its group, the controller and the
        agent (``agent_extra``: more of its TOML), the pool warm for that group."""
        self.network, _ = project_network(
            self.conn, self.project, "pwb-node", "10.79.0.0/24", dhcp=False
        )
        self.group = self.conn.network.create_security_group(
            name="pwb-node", project_id=self.project
        )
        self.services.start_controller([self.host])
        self.socket = self.services.start_agent(self.host, self.host_ns, vtep, agent_extra)
        self.populate([self.group.id])

    def populate(self, groups: list[str]) -> None:
        """A burst's worth of ports for ``groups`` in the node's pool, settled."""
        body = {
            "nodes": [self.host],
            "network": self.network.id,
            "project_id": self.project,
            "security_groups": groups,
            "count": POOL,
        }
        self.services.admin("POST", "/v1/pools/populate", body)
        self.settle()

    def spec(self, containerd: Containerd) -> InstallSpec:
        return InstallSpec(
            containerd.bin_dir,
            containerd.conf_dir,
            self.network.id,
            project=self.project,
            security_groups=[self.group.id],
            agent_socket=self.socket,
        )

    def settle(self, timeout: float = 180.0) -> None:
        """Until the node's pool holds a burst's worth of ready ports, all ACTIVE, and
        nothing changed for ``STEADY`` s: a top-up still under way would make Neutron's CPU
        part of whichever round comes next (the reference's included)."""
        deadline = time.monotonic() + timeout
        seen, since = None, time.monotonic()
        while time.monotonic() < deadline:
            ready = self._ready_ports()
            ports = list(self.conn.network.ports(project_id=self.project))
            active = sum(1 for p in ports if p.status == "ACTIVE")
            now = (ready, len(ports), active)
            if now != seen:
                seen, since = now, time.monotonic()
            elif ready >= BURST and active == len(ports) and time.monotonic() - since >= STEADY:
                return
            time.sleep(0.25)
        raise StackError(f"the pool of {self.host} did not settle at {BURST} ready ports")

    def _ready_ports(self) -> int:
        """The node's pooled ports; only those carrying ``settle_groups`` when set (a burst
        served from another set pays a port update per VIF)."""
        pools = self.services.admin("GET", "/v1/pools")["pools"]
        mine = [p for p in pools if p["key"]["node"] == self.host]
        if self.settle_groups is None:
            return sum(p["size"] for p in mine)
        wanted = sorted(self.settle_groups)
        return sum(
            len(g["ports"])
            for p in mine
            for g in p["groups"]
            if sorted(g["security_groups"]) == wanted
        )

    def close(self, stack: dict[str, Any]) -> None:
        self.services.stop()
        asyncio.run(_unpublish(stack, self.host))
        for attempt in range(5):
            try:  # a bulk create the stopped controller sent may still land its ports
                delete_project(self.conn, self.project)
                break
            except ConflictException:
                if attempt == 4:
                    raise
                time.sleep(2)


@dataclass(frozen=True)
class SimulatedHost:
    """A node's host namespace (its agent's host netns, where containerd runs) and its work dir."""

    host: str
    netns: str
    work: Path


@contextlib.contextmanager
def simulated_host(prefix: str) -> Iterator[SimulatedHost]:
    env = NetEnv()
    try:
        work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        yield SimulatedHost(f"{env.tag}-host", env.namespace("h"), work)
    finally:
        env.cleanup()


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    with simulated_host("pwb-cri-") as sim:
        containerd = Containerd(sim.work / "ctrd", netns=sim.netns)
        node = PodwireNode(stack, sim.work, sim.host, sim.netns)
        try:
            node.start()
            containerd.prepare()
            containerd.start()
            containerd.import_image()
            spec = node.spec(containerd)
            install(spec)
            singles = max(1, min(samples, 60) // ROUNDS)
            ours, ref = Phase(conflist(spec), singles), Phase(_reference(sim.work), singles)
            asyncio.run(_measure(containerd, ours, ref, node.settle))
            return _rows(ours, ref)
        finally:
            containerd.cleanup()
            node.close(stack)
