"""Driving containerd's CRI v1 RuntimeService over gRPC, as kubelet does.

Asynchronous (grpc.aio): the agents under test may run in the same event loop, and a sandbox
start waits for their CNI answer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from podwire.files import atomic_write
from podwire.kube.containerd import Containerd
from podwire.kube.cri.generated import cri_runtime_v1_pb2 as pb
from podwire.kube.cri.generated import cri_runtime_v1_pb2_grpc as pb_grpc


def restart(containerd: Containerd) -> None:
    """containerd stopped (SIGTERM: its shims and sandboxes keep running) and started again,
    as a node's service manager restarts it."""
    containerd.stop()
    containerd.start()


def write_conflist(conf_dir: Path, conflist: dict[str, Any]) -> Path:
    """Make ``conflist`` the only one in containerd's CNI conf dir (atomically: the CRI
    watches the dir and must never read half a file)."""
    path = conf_dir / f"10-{conflist['name']}.conflist"
    for old in conf_dir.iterdir():
        if old != path:
            old.unlink()
    atomic_write(path, json.dumps(conflist).encode(), 0o644)
    return path


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    uid: str

    @classmethod
    def new(cls, name: str, namespace: str = "default") -> Pod:
        return cls(name, namespace, str(uuid.uuid4()))


class Cri:
    def __init__(self, socket: str, timeout: float = 120.0) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix://{socket}")
        self._stub = pb_grpc.RuntimeServiceStub(self._channel)
        self.timeout = timeout

    async def close(self) -> None:
        await self._channel.close()

    async def version(self) -> Any:
        return await self._stub.Version(pb.VersionRequest(version="v1"), timeout=self.timeout)

    async def loaded_networks(self) -> list[Any]:
        """The CNI network configs the CRI has loaded (from its verbose status)."""
        status = await self._stub.Status(pb.StatusRequest(verbose=True), timeout=self.timeout)
        raw = json.loads(status.info.get("cniconfig", "{}"))
        return [json.loads(net["Config"]["Source"]) for net in raw.get("Networks") or []]

    async def wait_loaded(self, conflist: dict[str, Any], timeout: float = 30.0) -> None:
        """Until the CRI uses ``conflist`` (it reloads its conf dir on change)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while conflist not in await self.loaded_networks():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"containerd did not load {conflist['name']} in {timeout} s")
            await asyncio.sleep(0.05)

    def sandbox_config(
        self, pod: Pod, port_mappings: list[tuple[int, int]] | None = None, attempt: int = 0
    ) -> Any:
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(
                name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=attempt
            ),
            hostname=pod.name,
            port_mappings=[
                pb.PortMapping(protocol=pb.TCP, container_port=inner, host_port=outer)
                for inner, outer in port_mappings or []
            ],
            linux=pb.LinuxPodSandboxConfig(
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.POD, pid=pb.POD, ipc=pb.POD)
                )
            ),
        )

    async def run(
        self, pod: Pod, port_mappings: list[tuple[int, int]] | None = None, attempt: int = 0
    ) -> str:
        config = self.sandbox_config(pod, port_mappings, attempt)
        request = pb.RunPodSandboxRequest(config=config)
        answer = await self._stub.RunPodSandbox(request, timeout=self.timeout)
        return str(answer.pod_sandbox_id)

    async def status(self, sandbox: str) -> Any:
        request = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox, verbose=True)
        return await self._stub.PodSandboxStatus(request, timeout=self.timeout)

    async def ip(self, sandbox: str) -> str:
        return str((await self.status(sandbox)).status.network.ip)

    async def netns(self, sandbox: str) -> str:
        """The sandbox's network namespace path (from the verbose status' runtime spec)."""
        info = json.loads((await self.status(sandbox)).info["info"])
        for ns in info["runtimeSpec"]["linux"]["namespaces"]:
            if ns["type"] == "network":
                return str(ns["path"])
        raise AssertionError(f"sandbox {sandbox} has no network namespace")

    async def ready(self, sandbox: str) -> bool:
        return bool((await self.status(sandbox)).status.state == pb.SANDBOX_READY)

    async def stop(self, sandbox: str) -> None:
        request = pb.StopPodSandboxRequest(pod_sandbox_id=sandbox)
        await self._stub.StopPodSandbox(request, timeout=self.timeout)

    async def remove(self, sandbox: str) -> None:
        request = pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox)
        await self._stub.RemovePodSandbox(request, timeout=self.timeout)

    async def sandboxes(self) -> list[str]:
        listed = await self._stub.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=self.timeout)
        return [item.id for item in listed.items]

    async def remove_all(self) -> None:
        for sandbox in await self.sandboxes():
            await self.stop(sandbox)
            await self.remove(sandbox)
