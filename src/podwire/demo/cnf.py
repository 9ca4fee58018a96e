"""The memif step: a CNF (DPDK testpmd, icmpecho) on host 1 answers a veth pod on host 2.

Kubelet hands out the ``podwire.io/memif`` grant; here its protocol-faithful peer
(``podwire.deviceplugin.kubelet_peer``) does, on its own event loop in a thread, while the
demo's steps stay synchronous. The CNF is testpmd as the memif client on the granted socket,
stopped by pid.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from podwire.demo import testpmd
from podwire.demo.topology import ping_times
from podwire.deviceplugin.kubelet_peer import KubeletPeer, allocate_request
from podwire.deviceplugin.model import ENV_SECRET, ENV_SOCKET, PodName
from podwire.errors import StackError
from podwire.memif import build as memif_build

RESOURCE = "podwire.io/memif"
T = TypeVar("T")


def missing() -> str:
    """Why the step cannot run on this machine, or "" when it can."""
    if not testpmd.available():
        return "dpdk-testpmd not found (Debian dpdk-dev)"
    if memif_build.find() is None:
        return "podwire-memif not built (scripts/setup builds it)"
    return ""


class KubeletThread:
    """The kubelet peer served from a thread: device plugin registration, grants, PodResources."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.peer: KubeletPeer | None = None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.thread.start()
        self.peer = self.call(self._serve())

    async def _serve(self) -> KubeletPeer:
        peer = KubeletPeer(self.root, RESOURCE)
        await peer.start()
        await peer.start_pod_resources()
        return peer

    def settings_toml(self, devices: int = 4) -> str:
        """The agent's [deviceplugin] section pointing at this kubelet."""
        return (
            f"[deviceplugin]\nenabled = true\ndevices = {devices}\n"
            f'device_plugins_dir = "{self.root / "device-plugins"}"\n'
            f'pod_resources_socket = "{self.root / "pod-resources" / "kubelet.sock"}"\n'
            f'memif_host_dir = "{self.root / "memif"}"\n'
            f'checkpoint = "{self.root / "memif-checkpoint.json"}"\n'
        )

    def grant(self, pod: PodName, device: str) -> GrantedSocket:
        """Admit ``pod`` with one memif device, as kubelet does: Allocate, then PodResources."""
        return self.call(self._grant(pod, device))

    async def _grant(self, pod: PodName, device: str) -> GrantedSocket:
        assert self.peer is not None
        async with asyncio.timeout(30):
            while self.peer.stub is None:  # the agent's plugin registers once it is up
                await self.peer.register_events.get()
        response = await self.peer.stub.Allocate(allocate_request([device]))
        container = response.container_responses[0]
        self.peer.pods[pod] = [device]
        host_dir = container.mounts[0].host_path
        socket = Path(host_dir) / Path(container.envs[ENV_SOCKET]).name
        return GrantedSocket(str(socket), container.envs[ENV_SECRET], host_dir)

    def stop(self) -> None:
        if self.peer is not None:
            self.call(self.peer.stop())
            self.peer = None
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        self.loop.close()


@dataclass(frozen=True)
class GrantedSocket:
    socket: str
    secret: str
    host_dir: str


@dataclass
class CnfFigures:
    skipped: str = ""
    answered: int = 0
    sent: int = 0
    rtt_ms: list[float] = field(default_factory=list)

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"memif CNF: skipped, {self.skipped}"]
        ordered = sorted(self.rtt_ms)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        return [
            f"memif CNF (dpdk-testpmd icmpecho) on host 1, pinged from host 2: {self.answered}"
            f" of {self.sent} answered, RTT p50 {statistics.median(self.rtt_ms):.2f} ms,"
            f" p99 {p99:.2f} ms"
        ]


def memif_ip(result: dict[str, Any]) -> tuple[str, str]:
    """The memif interface's (address, mac) in a CNI result."""
    index = next(i for i, item in enumerate(result["interfaces"]) if item["name"] == "memif0")
    address = next(ip["address"] for ip in result["ips"] if ip["interface"] == index)
    return address.split("/")[0], str(result["interfaces"][index]["mac"])


def ping_cnf(
    grant: GrantedSocket, mac: str, client_netns: str, address: str, log: Path, count: int
) -> CnfFigures:
    cnf = testpmd.Testpmd.memif_client(grant.socket, grant.secret, mac, log=log)
    cnf.start()
    try:
        if not _answers_within(client_netns, address, 20.0):
            raise StackError(f"the memif CNF at {address} never answered (testpmd log: {log})")
        samples = ping_times(client_netns, address, count)
    finally:
        cnf.stop()
    if not samples:
        raise StackError(f"the memif CNF at {address} stopped answering (testpmd log: {log})")
    return CnfFigures(answered=len(samples), sent=count, rtt_ms=samples)


def _answers_within(netns: str, address: str, seconds: float) -> bool:
    command = ["ip", "netns", "exec", netns, "ping", "-c", "1", "-W", "1", "-q", address]
    for _ in range(int(seconds)):
        if subprocess.run(command, capture_output=True, check=False).returncode == 0:
            return True
    return False
