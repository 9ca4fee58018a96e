"""Pod sandboxes through containerd's CRI: podwire's conflist vs bridge + host-local.

One private containerd 1.6 (``tests/cri/containerd.py``) runs in a simulated host namespace;
the same instance serves both conflists in turn, alternating (and swapping which goes first)
by round so drift of this noisy VM hits both alike. podwire's agent is its own process on its
warm path (pre-created, pre-bound ports, as ``cni_bench``), so the figures are what a node
pays per pod with pools.
Rows: RunPodSandbox one at a time (exec of every plugin, runc, the pause process), the wall
time of 30 RunPodSandbox at once, and of 30 StopPodSandbox + RemovePodSandbox at once.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.cni_bench import (
    AgentProcess,
    _agent_config,
    _prepare_ports,
    _publish,
    _unpublish,
    _vif,
    _vifs_file,
)
from bench.stats import row
from podwire.cni.install import InstallSpec, conflist, install
from podwire.neutron.client import neutron_connection
from tests.cri.containerd import Containerd
from tests.cri.cri import Cri, Pod

BURST = 30
ROUNDS = 5


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


class Phase:
    """One conflist's samples."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.run: list[float] = []
        self.burst: list[float] = []
        self.teardown: list[float] = []


async def _timed_run(cri: Cri, pod: Pod) -> tuple[str, float]:
    started = time.perf_counter()
    sandbox = await cri.run(pod)
    return sandbox, (time.perf_counter() - started) * 1000


async def _gone(cri: Cri, sandboxes: list[str]) -> float:
    started = time.perf_counter()

    async def one(sandbox: str) -> None:
        await cri.stop(sandbox)
        await cri.remove(sandbox)

    await asyncio.gather(*(one(s) for s in sandboxes))
    return (time.perf_counter() - started) * 1000


async def _round(containerd: Containerd, cri: Cri, phase: Phase, singles: int, tag: str) -> None:
    containerd.write_conflist(phase.body)
    await cri.wait_loaded(phase.body)
    for i in range(singles):
        sandbox, took = await _timed_run(cri, Pod.new(f"{tag}-s{i}"))
        phase.run.append(took)
        await _gone(cri, [sandbox])
    started = time.perf_counter()
    sandboxes = await asyncio.gather(*(cri.run(Pod.new(f"{tag}-b{i}")) for i in range(BURST)))
    phase.burst.append((time.perf_counter() - started) * 1000)
    phase.teardown.append(await _gone(cri, list(sandboxes)))


async def _measure(containerd: Containerd, ours: Phase, ref: Phase, singles: int) -> None:
    cri = Cri(containerd.socket)
    try:
        for round_ in range(ROUNDS):
            first, second = (ours, ref) if round_ % 2 == 0 else (ref, ours)  # no order bias
            for phase in (first, second):
                name = "pw" if phase is ours else "ref"
                await _round(containerd, cri, phase, singles, f"{name}{round_}")
    finally:
        await cri.remove_all()
        await cri.close()


def _rows(ours: Phase, ref: Phase) -> list[dict[str, Any]]:
    reference = "bridge+host-local, same containerd"
    return [
        row("CRI RunPodSandbox (podwire, warm port)", ours.run, reference, ref.run),
        row(f"CRI {BURST} RunPodSandbox at once, wall", ours.burst, reference, ref.burst),
        row(
            f"CRI {BURST} StopPodSandbox+RemovePodSandbox at once, wall",
            ours.teardown,
            reference,
            ref.teardown,
        ),
    ]


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    tag = f"pwt-{uuid.uuid4().hex[:6]}"
    host_ns, host = f"{tag}-h", f"{tag}-host"
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    work = Path(tempfile.mkdtemp(prefix="pwb-cri-", dir="/tmp"))
    containerd = Containerd(work / "ctrd", netns=host_ns)
    agent: AgentProcess | None = None
    subprocess.run(["ip", "netns", "add", host_ns], check=True, capture_output=True)
    try:
        subprocess.run(
            ["ip", "netns", "exec", host_ns, "ip", "link", "set", "lo", "up"], check=True
        )
        (network, subnet), ports = _prepare_ports(conn, project, host, BURST + 2)
        vifs = [_vif(p, network, subnet) for p in ports]
        asyncio.run(_publish(stack, host, vifs, network))
        socket = str(work / "agent.sock")
        agent = AgentProcess(
            _agent_config(work, stack, host, host_ns, socket), _vifs_file(work, vifs)
        )
        agent.start()
        containerd.prepare()
        containerd.start()
        containerd.import_image()
        spec = InstallSpec(containerd.bin_dir, containerd.conf_dir, network.id, agent_socket=socket)
        install(spec)
        ours, ref = Phase(conflist(spec)), Phase(_reference(work))
        singles = max(1, min(samples, 60) // ROUNDS)
        asyncio.run(_measure(containerd, ours, ref, singles))
        return _rows(ours, ref)
    finally:
        containerd.cleanup()
        if agent is not None:
            agent.stop()
        asyncio.run(_unpublish(stack, host))
        for port in conn.network.ports(project_id=project):
            conn.network.delete_port(port)
        for net in conn.network.networks(project_id=project):
            conn.network.delete_network(net)
        subprocess.run(["ip", "netns", "del", host_ns], check=False, capture_output=True)
