"""Device plugin: Allocate latency over kubelet's gRPC API, and re-registration after a kubelet
restart. Targets (issue 6): Allocate p99 < 10 ms; re-registered < 1 s after a kubelet restart.

A minimal kubelet peer (Registration server on ``kubelet.sock``) runs in-process; the plugin is
the real ``DevicePlugin`` with its checkpoint on the local disk (fsync included). References
from the same run: a bare unary gRPC round trip on the plugin's socket (the floor under any
Allocate) and the plugin's cold start to registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc

from bench.stats import row, timed
from podwire.config import DevicePluginSettings
from podwire.deviceplugin import DevicePlugin
from podwire.deviceplugin.api import (
    RegistrationServicerBase,
    add_registration_servicer,
    device_plugin_stub,
    dp,
)
from tests.kubelet_peer import allocate_request

LIVE_GRANTS = 50


class _Kubelet(RegistrationServicerBase):  # type: ignore[misc]
    def __init__(self, plugins_dir: Path) -> None:
        self.plugins_dir = plugins_dir
        self.registered: asyncio.Queue[float] = asyncio.Queue()
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.server = grpc.aio.server()
        add_registration_servicer(self, self.server)
        self.server.add_insecure_port(f"unix://{self.plugins_dir / 'kubelet.sock'}")
        await self.server.start()

    async def restart(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
        for entry in self.plugins_dir.iterdir():
            entry.unlink()
        await self.start()

    async def Register(self, request: Any, context: Any) -> Any:
        self.registered.put_nowait(time.perf_counter())
        return dp.Empty()


async def _measure(root: Path, samples: int) -> list[dict[str, Any]]:
    plugins_dir = root / "device-plugins"
    plugins_dir.mkdir()
    kubelet = _Kubelet(plugins_dir)
    await kubelet.start()
    settings = DevicePluginSettings(
        enabled=True,
        devices=LIVE_GRANTS + 50,
        device_plugins_dir=str(plugins_dir),
        pod_resources_socket=str(root / "pod-resources.sock"),
        memif_host_dir=str(root / "memif"),
        checkpoint=str(root / "state" / "memif-checkpoint.json"),
    )
    plugin = DevicePlugin(settings, reconcile_interval=3600, reconcile_grace=3600)
    cold_started = time.perf_counter()
    task = asyncio.create_task(plugin.run())
    cold = [(await kubelet.registered.get() - cold_started) * 1000]
    try:
        async with grpc.aio.insecure_channel(f"unix://{plugin.socket_path}") as channel:
            stub = device_plugin_stub(channel)
            for index in range(LIVE_GRANTS):
                await stub.Allocate(allocate_request([f"memif-{index}"]))
            floor = [await timed(stub.GetDevicePluginOptions, dp.Empty()) for _ in range(samples)]
            allocate, burst = [], []
            for index in range(samples):
                device = f"memif-{LIVE_GRANTS + index % 50}"
                started = time.perf_counter()
                response = await stub.Allocate(allocate_request([device]))
                allocate.append((time.perf_counter() - started) * 1000)
                await plugin.allocator.release(
                    [a.id for a in plugin.allocator.for_devices([device])], reason="bench"
                )
                assert response.container_responses[0].envs["MEMIF_SECRET"]
            for _ in range(max(1, samples // 20)):
                burst.extend(await _burst(stub, plugin, 20))
        cold_restart = []
        for _ in range(max(3, min(samples // 10, 20))):
            started = time.perf_counter()
            await kubelet.restart()
            registered = await kubelet.registered.get()
            cold_restart.append((registered - started) * 1000)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if kubelet.server is not None:
            await kubelet.server.stop(None)
    floor_name = "unary gRPC RTT, same socket"
    return [
        row("deviceplugin Allocate (1 device, fsync'd)", allocate, floor_name, floor),
        row("deviceplugin Allocate, 20 concurrent", burst, floor_name, floor),
        row("deviceplugin re-registered after kubelet restart", cold_restart, "cold start", cold),
    ]


async def _burst(stub: Any, plugin: DevicePlugin, size: int) -> list[float]:
    devices = [f"memif-{LIVE_GRANTS + i}" for i in range(size)]
    requests = [allocate_request([device]) for device in devices]
    latencies = await asyncio.gather(*(timed(stub.Allocate, request) for request in requests))
    await plugin.allocator.release(
        [a.id for a in plugin.allocator.for_devices(devices)], reason="bench"
    )
    return list(latencies)


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    """A bench section; needs no stack (kubelet is the protocol-faithful peer)."""
    # Restarts log warnings by design; they are not what is measured.
    logging.getLogger("podwire").setLevel(logging.ERROR)
    root = Path(tempfile.mkdtemp(prefix="pwb-dp-", dir="/tmp"))
    try:
        return asyncio.run(_measure(root, samples))
    finally:
        shutil.rmtree(root, ignore_errors=True)
