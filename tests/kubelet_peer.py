"""A kubelet peer for the device plugin's unit-level tests: real gRPC servers on real unix
sockets, where starting a kubelet per case would be too slow or could not stage the case.

``KubeletPeer`` implements the kubelet side of the two APIs from the same .proto files: the
Registration service (which, like kubelet, dials the plugin back and consumes ListAndWatch)
and the PodResourcesLister service. ``restart()`` does what a kubelet restart does to the
plugin dir: every socket in it disappears and a new kubelet.sock shows up. Every behaviour
tested with it is also tested with the real kubelet (tests/kube/test_deviceplugin.py,
tests/kube/test_cnf.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from podwire.deviceplugin.api import (
    API_VERSION,
    PodResourcesListerServicerBase,
    RegistrationServicerBase,
    add_pod_resources_servicer,
    add_registration_servicer,
    device_plugin_stub,
    dp,
    pr,
)
from podwire.deviceplugin.model import PodName


@dataclasses.dataclass
class Registered:
    request: Any
    # Whether the plugin's own socket answered while Register was still in progress: kubelet
    # dials back right away, so a plugin registering before it serves is broken.
    answered_during_register: bool


class KubeletPeer(RegistrationServicerBase, PodResourcesListerServicerBase):  # type: ignore[misc]
    def __init__(self, root: Path, resource_name: str) -> None:
        self.plugins_dir = root / "device-plugins"
        self.plugins_dir.mkdir()
        (root / "pod-resources").mkdir()
        self.podres_socket = root / "pod-resources" / "kubelet.sock"
        self.resource_name = resource_name
        self.reject_with: str | None = None
        self.registrations: list[Registered] = []
        self.register_events: asyncio.Queue[Registered] = asyncio.Queue()
        self.pods: dict[PodName, list[str]] = {}
        self.get_enabled = True
        self.devices: list[Any] = []
        self._devices_changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None
        self._podres_server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._watch: asyncio.Task[None] | None = None
        self.stub: Any = None

    # -- lifecycle --

    async def start(self) -> None:
        server = grpc.aio.server()
        add_registration_servicer(self, server)
        server.add_insecure_port(f"unix://{self.plugins_dir / 'kubelet.sock'}")
        await server.start()
        self._server = server

    async def start_pod_resources(self) -> None:
        server = grpc.aio.server()
        add_pod_resources_servicer(self, server)
        server.add_insecure_port(f"unix://{self.podres_socket}")
        await server.start()
        self._podres_server = server

    async def stop_pod_resources(self) -> None:
        if self._podres_server is not None:
            await self._podres_server.stop(None)
            self._podres_server = None

    async def stop(self) -> None:
        await self._drop_plugin()
        for server in (self._server, self._podres_server):
            if server is not None:
                await server.stop(None)
        self._server = self._podres_server = None

    async def restart(self) -> None:
        """Kubelet restart: its server goes, every socket in the plugin dir is removed, a new
        kubelet.sock appears."""
        await self._drop_plugin()
        if self._server is not None:
            await self._server.stop(None)
        for entry in self.plugins_dir.iterdir():
            entry.unlink()
        await self.start()

    async def _drop_plugin(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    # -- Registration service --

    async def Register(self, request: Any, context: Any) -> Any:
        if request.version != API_VERSION:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"unsupported API version {request.version}"
            )
        if self.reject_with is not None:
            await context.abort(grpc.StatusCode.UNKNOWN, self.reject_with)
        await self._drop_plugin()
        self._channel = grpc.aio.insecure_channel(f"unix://{self.plugins_dir / request.endpoint}")
        self.stub = device_plugin_stub(self._channel)
        try:
            await self.stub.GetDevicePluginOptions(dp.Empty(), timeout=2)
            answered = True
        except grpc.aio.AioRpcError:
            answered = False
        self._watch = asyncio.create_task(self._consume(self.stub))
        event = Registered(request, answered)
        self.registrations.append(event)
        self.register_events.put_nowait(event)
        return dp.Empty()

    async def _consume(self, stub: Any) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for response in stub.ListAndWatch(dp.Empty()):
                async with self._devices_changed:
                    self.devices = list(response.devices)
                    self._devices_changed.notify_all()

    async def wait_devices(self, predicate: Callable[[list[Any]], bool]) -> list[Any]:
        async with asyncio.timeout(10):
            async with self._devices_changed:
                await self._devices_changed.wait_for(lambda: predicate(self.devices))
        return self.devices

    # -- PodResources service --

    def _pod(self, pod: PodName, devices: list[str]) -> Any:
        return pr.PodResources(
            name=pod.name,
            namespace=pod.namespace,
            containers=[
                pr.ContainerResources(
                    name="app",
                    devices=[
                        pr.ContainerDevices(resource_name=self.resource_name, device_ids=devices),
                        pr.ContainerDevices(resource_name="other.io/gpu", device_ids=["gpu-0"]),
                    ],
                )
            ],
        )

    async def List(self, request: Any, context: Any) -> Any:
        return pr.ListPodResourcesResponse(
            pod_resources=[self._pod(pod, devices) for pod, devices in self.pods.items()]
        )

    async def Get(self, request: Any, context: Any) -> Any:
        if not self.get_enabled:
            await context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        pod = PodName(request.pod_namespace, request.pod_name)
        if pod not in self.pods:
            await context.abort(grpc.StatusCode.UNKNOWN, f"pod {pod} not found")
        return pr.GetPodResourcesResponse(pod_resources=self._pod(pod, self.pods[pod]))

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return pr.AllocatableResourcesResponse()


def allocate_request(*containers: list[str]) -> Any:
    """What kubelet sends the plugin when it admits a pod: device ids per container."""
    return dp.AllocateRequest(
        container_requests=[dp.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )
