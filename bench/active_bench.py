"""How soon Neutron shows a pod's port ACTIVE, in the containerd tests' scenarios (restarts).

What Neutron is told must be true on the node, and soon: a port stays DOWN until the agent
has wired it and reported it, and an orchestrator (or a user's script) waiting for ACTIVE
waits that long. Measured as the containerd tests run a node: a private containerd 1.6, the
agent as a process with its ports straight from Neutron (``vif_source = "neutron"``: each
ADD creates and binds the port, so every sample pays the whole bind -> wire -> report path),
the conflist ``podwire cni install`` writes. Each sample is one RunPodSandbox, from the call
to the moment a Neutron listing shows its address's port ACTIVE; the clock starts before the
ADD, so it bounds the time from the ADD from above.

Scenarios, each on pods started after it: steady; after a containerd restart; after an agent
restart (SIGTERM, started again on its checkpoint); the agent down during a RunPodSandbox,
then kubelet's retry (stop and remove the failed sandbox, run the next attempt).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from bench.cni_bench import _unpublish
from bench.cri_bench import simulated_host
from bench.harness import delete_project, project_network
from bench.stats import row
from podwire.cni.install import InstallSpec, install
from podwire.demo.services import Services
from podwire.errors import StackError
from podwire.kube.containerd import Containerd
from podwire.neutron.client import neutron_connection
from tests.cri.cri import Cri, Pod
from tests.cri.cri import restart as restart_cri

VTEP = "192.0.2.1"
POLL = 0.02  # seconds between Neutron listings while waiting for ACTIVE
GIVE_UP = 30.0  # a port not ACTIVE by then is reported as this many seconds


class Node:
    """One simulated node: the agent process, containerd, a network of the bench's project."""

    def __init__(self, stack: dict[str, Any], work: Path, host: str, host_ns: str) -> None:
        self.conn = neutron_connection(stack["neutron"])
        self.services = Services(work, stack["etcd"], stack["neutron"])
        self.host, self.host_ns = host, host_ns
        self.project = uuid.uuid4().hex
        self.containerd = Containerd(work / "ctrd", netns=host_ns)
        self.network: Any = None

    def start(self) -> None:
        self.network, _ = project_network(
            self.conn, self.project, "pwb-active", "10.78.0.0/24", dhcp=False
        )
        socket = self.start_agent()
        self.containerd.prepare()
        self.containerd.start()
        self.containerd.import_image()
        spec = InstallSpec(
            self.containerd.bin_dir,
            self.containerd.conf_dir,
            self.network.id,
            project=self.project,
            agent_socket=socket,
        )
        install(spec)

    def start_agent(self) -> str:
        return self.services.start_agent(self.host, self.host_ns, VTEP, vif_source="neutron")

    def status_of(self, ip: str) -> str | None:
        for port in self.conn.network.ports(project_id=self.project):
            if any(fixed["ip_address"] == ip for fixed in port.fixed_ips or ()):
                return str(port.status)
        return None

    def close(self, stack: dict[str, Any]) -> None:
        self.containerd.cleanup()
        self.services.stop()
        asyncio.run(_unpublish(stack, self.host))
        delete_project(self.conn, self.project)


async def _to_active(node: Node, cri: Cri, pod: Pod, attempt: int = 0) -> float:
    """Milliseconds from RunPodSandbox until a Neutron listing shows its port ACTIVE."""
    started = time.perf_counter()
    ip = await cri.ip(await cri.run(pod, attempt=attempt))
    while time.perf_counter() - started < GIVE_UP:
        if await asyncio.to_thread(node.status_of, ip) == "ACTIVE":
            break
        await asyncio.sleep(POLL)
    return (time.perf_counter() - started) * 1000


async def _timed_pods(node: Node, cri: Cri, tag: str, count: int) -> list[float]:
    """Run ``count`` sandboxes one at a time, each timed to ACTIVE, then remove them."""
    samples = [await _to_active(node, cri, Pod.new(f"{tag}-{i}")) for i in range(count)]
    await cri.remove_all()
    return samples


async def _retried_run(node: Node, cri: Cri, tag: str) -> list[float]:
    """The agent down during a RunPodSandbox; kubelet's retry once it is back."""
    node.services.stop_child(node.host)
    pod = Pod.new(tag)
    try:
        await cri.run(pod)
    except grpc.aio.AioRpcError:
        pass
    else:
        raise StackError("RunPodSandbox succeeded with the podwire agent stopped")
    await asyncio.to_thread(node.start_agent)
    await cri.remove_all()  # the failed attempt's sandbox, as kubelet removes it
    took = await _to_active(node, cri, pod, attempt=1)
    await cri.remove_all()
    return [took]


async def _measure(node: Node, cri: Cri, rounds: int, per_round: int) -> dict[str, list[float]]:
    restarts: dict[str, Callable[[], Awaitable[None]]] = {
        "steady": lambda: asyncio.sleep(0),
        "after a containerd restart": lambda: asyncio.to_thread(restart_cri, node.containerd),
        "after an agent restart": lambda: _restart_agent(node),
    }
    samples: dict[str, list[float]] = {name: [] for name in restarts}
    samples["agent down during RunPodSandbox, kubelet's retry"] = []
    await _timed_pods(node, cri, "warm", 1)
    for round_ in range(rounds):
        for name, restart in restarts.items():
            await restart()
            samples[name] += await _timed_pods(
                node, cri, f"r{round_}-{len(samples[name])}", per_round
            )
        samples["agent down during RunPodSandbox, kubelet's retry"] += await _retried_run(
            node, cri, f"retry{round_}"
        )
    return samples


async def _restart_agent(node: Node) -> None:
    await asyncio.to_thread(node.services.stop_child, node.host)
    await asyncio.to_thread(node.start_agent)


async def _run(node: Node, rounds: int, per_round: int) -> dict[str, list[float]]:
    cri = Cri(node.containerd.socket)
    try:
        return await _measure(node, cri, rounds, per_round)
    finally:
        await cri.remove_all()
        await cri.close()


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    with simulated_host("pwb-act-") as sim:
        node = Node(stack, sim.work, sim.host, sim.netns)
        try:
            node.start()
            rounds = max(1, min(samples, 30) // 6)
            measured = asyncio.run(_run(node, rounds, per_round=2))
        finally:
            node.close(stack)
    return [
        row(f"port ACTIVE in Neutron from RunPodSandbox, {name} (target < 1 s)", values)
        for name, values in measured.items()
    ]
