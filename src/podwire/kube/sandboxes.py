"""Removing every pod sandbox of a node through containerd's CRI, as kubelet would.

A node that goes away must stop its sandboxes through the CRI, not by ending containerd and
its shims: only ``StopPodSandbox`` runs the CNI DEL that gives each pod's port back. A DEL
can fail while the agent is briefly away (restarting): each sandbox is retried for a while
before it is reported as left behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import grpc

from podwire.backoff import Backoff
from podwire.errors import KubeError
from podwire.kube.cri.generated import cri_runtime_v1_pb2 as pb
from podwire.kube.cri.generated import cri_runtime_v1_pb2_grpc as pb_grpc
from podwire.log import get_logger

log = get_logger(__name__)
# The generated gRPC module is untyped (grpcio-tools writes no stubs for it).
_grpc_any: Any = pb_grpc


@dataclass(frozen=True)
class Sandbox:
    id: str
    name: str
    namespace: str


class Runtime:
    """A synchronous CRI RuntimeService client on a unix socket."""

    def __init__(self, socket: str, timeout: float = 60.0) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._stub = _grpc_any.RuntimeServiceStub(self._channel)
        self.timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def sandboxes(self) -> list[Sandbox]:
        listed = self._call("ListPodSandbox", pb.ListPodSandboxRequest())
        return [Sandbox(i.id, i.metadata.name, i.metadata.namespace) for i in listed.items]

    def stop(self, sandbox: str) -> None:
        self._call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox))

    def remove(self, sandbox: str) -> None:
        self._call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox))

    def _call(self, method: str, request: object) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise KubeError(f"CRI {method}: {exc.details()}") from exc


def remove_all(socket: str, patience: float = 30.0) -> list[str]:
    """Stop and remove every sandbox; returns those that could not be (with the reason)."""
    runtime = Runtime(socket)
    try:
        return [
            failure
            for sandbox in _listed(runtime, patience)
            if (failure := _remove(runtime, sandbox, patience))
        ]
    finally:
        runtime.close()


def _listed(runtime: Runtime, patience: float) -> list[Sandbox]:
    """The sandboxes, once the CRI answers: a containerd just started on old state answers
    ``server is not initialized yet`` while it loads them."""
    deadline = time.monotonic() + patience
    backoff = Backoff(0.1, 1.0)
    while True:
        try:
            return runtime.sandboxes()
        except KubeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(backoff.next())


def _remove(runtime: Runtime, sandbox: Sandbox, patience: float) -> str:
    """Stop (CNI DEL) then remove one sandbox, retrying until ``patience`` runs out; returns
    "" when done, else what stopped it."""
    deadline = time.monotonic() + patience
    backoff = Backoff(0.2, 2.0)
    while True:
        try:
            runtime.stop(sandbox.id)
            runtime.remove(sandbox.id)
            log.info("kube_node.sandbox_removed", pod=f"{sandbox.namespace}/{sandbox.name}")
            return ""
        except KubeError as exc:
            if time.monotonic() > deadline:
                return f"{sandbox.namespace}/{sandbox.name} ({sandbox.id[:12]}): {exc}"
            log.warning("kube_node.sandbox_retry", sandbox=sandbox.id[:12], error=str(exc))
            time.sleep(backoff.next())
