"""The DevicePlugin gRPC service kubelet dials, and the unix-socket endpoint serving it.

The endpoint is torn down and rebuilt on every kubelet restart (kubelet deletes every socket in
its plugin dir when it starts), while the servicer and the grants it hands out live on.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NoReturn

import grpc

from podwire.deviceplugin.allocator import AllocateConflict, MemifAllocator
from podwire.deviceplugin.api import (
    DevicePluginServicerBase,
    add_device_plugin_servicer,
    device_plugin_stub,
    dp,
)
from podwire.deviceplugin.model import ENV_SECRET, ENV_SOCKET
from podwire.deviceplugin.registration import options
from podwire.deviceplugin.stats import Stats
from podwire.deviceplugin.watcher import identity
from podwire.errors import PermanentError, PodwireError, RetryableError, ValidationError
from podwire.log import get_logger

log = get_logger(__name__)

# sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class DevicePluginService(DevicePluginServicerBase):
    def __init__(self, allocator: MemifAllocator, stats: Stats) -> None:
        self._allocator = allocator
        self._stats = stats

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.DevicePluginOptions:
        return options()

    async def ListAndWatch(
        self, request: dp.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        seen = -1
        while True:
            if self._allocator.version != seen:
                seen = self._allocator.version
                yield dp.ListAndWatchResponse(
                    devices=[
                        dp.Device(ID=device, health=health)
                        for device, health in self._allocator.devices()
                    ]
                )
            await self._allocator.wait_changed(seen)

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.PreferredAllocationResponse:
        if not request.container_requests:
            await self._fail(context, ValidationError("empty request: no container_requests"))
        responses = []
        for position, item in enumerate(request.container_requests):
            try:
                chosen = self._allocator.preferred(
                    list(item.available_deviceIDs),
                    list(item.must_include_deviceIDs),
                    item.allocation_size,
                )
            except PodwireError as exc:
                await self._fail(context, exc, f"container_requests[{position}]: ")
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        self._stats.inc("preferred_allocations")
        return dp.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(
        self, request: dp.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.AllocateResponse:
        requests = [list(item.devices_ids) for item in request.container_requests]
        try:
            grants = await self._allocator.allocate(requests)
        except PodwireError as exc:
            self._stats.inc("allocate_errors")
            log.warning("deviceplugin.allocate.failed", request=requests, error=str(exc))
            await self._fail(context, exc)
        except Exception:
            self._stats.inc("allocate_errors")
            self._stats.inc("errors")
            log.exception("deviceplugin.allocate.crashed", request=requests)
            raise
        self._stats.inc("allocations", len(grants))
        responses = []
        for grant in grants:
            info = grant.info
            log.info(
                "deviceplugin.allocate.granted",
                allocation=grant.allocation.id,
                devices=list(info.devices),
                host_dir=info.host_dir,
            )
            responses.append(
                dp.ContainerAllocateResponse(
                    envs={ENV_SOCKET: info.container_socket, ENV_SECRET: info.secret},
                    mounts=[
                        dp.Mount(
                            container_path=os.path.dirname(info.container_socket),
                            host_path=info.host_dir,
                            read_only=False,
                        )
                    ],
                )
            )
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.PreStartContainerResponse:
        # Registered with pre_start_required=false: kubelet should never call this, and when
        # something does there is nothing to prepare.
        return dp.PreStartContainerResponse()

    async def _fail(
        self, context: grpc.aio.ServicerContext[Any, Any], exc: PodwireError, prefix: str = ""
    ) -> NoReturn:
        if isinstance(exc, ValidationError):
            code = grpc.StatusCode.INVALID_ARGUMENT
        elif isinstance(exc, AllocateConflict):
            code = grpc.StatusCode.ABORTED
        elif isinstance(exc, RetryableError):
            code = grpc.StatusCode.UNAVAILABLE
        else:
            code = grpc.StatusCode.FAILED_PRECONDITION
        await context.abort(code, f"{prefix}{exc}")
        raise AssertionError("context.abort returned")


class EndpointError(RetryableError):
    """Our socket could not be served or did not answer its own health call."""


class PluginEndpoint:
    def __init__(
        self, socket_path: Path, service: DevicePluginService, *, check_timeout: float = 2.0
    ) -> None:
        if len(str(socket_path).encode()) > MAX_SOCKET_PATH:
            raise PermanentError(
                f"socket path {socket_path} is longer than {MAX_SOCKET_PATH} bytes"
            )
        self.socket_path = socket_path
        self._service = service
        self._check_timeout = check_timeout
        self._server: grpc.aio.Server | None = None
        self._identity: tuple[int, int] | None = None

    async def start(self) -> None:
        """Listen on a fresh socket and prove it answers before anyone is told about it."""
        # The old server's peer (a kubelet that restarted) is gone: nothing to wait for.
        await self.stop(grace=None)
        self._clear_stale()
        server = grpc.aio.server()
        add_device_plugin_servicer(self._service, server)
        try:
            server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError as exc:
            raise EndpointError(f"cannot listen on {self.socket_path}: {exc}") from exc
        await server.start()
        self._server = server
        try:
            os.chmod(self.socket_path, 0o600)
            self._identity = identity(self.socket_path)
            await self._self_check()
        except BaseException:
            await self.stop()
            raise

    async def stop(self, grace: float | None = 0.2) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace)
        if self._identity is not None and identity(self.socket_path) == self._identity:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._identity = None

    def alive(self) -> bool:
        """False once kubelet (or anyone) removed or replaced our socket file."""
        return (
            self._server is not None
            and self._identity is not None
            and identity(self.socket_path) == self._identity
        )

    def _clear_stale(self) -> None:
        try:
            mode = os.lstat(self.socket_path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise PermanentError(
                f"{self.socket_path} exists and is not a socket; refusing to replace it"
            )
        self.socket_path.unlink()

    async def _self_check(self) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.socket_path}") as channel:
            try:
                await device_plugin_stub(channel).GetDevicePluginOptions(
                    dp.Empty(), timeout=self._check_timeout, wait_for_ready=True
                )
            except grpc.aio.AioRpcError as exc:
                raise EndpointError(
                    f"our own socket {self.socket_path} does not answer: {exc.code().name}:"
                    f" {exc.details()}"
                ) from exc
