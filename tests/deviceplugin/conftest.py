"""Device plugin fixtures: the plugin as a task (the kubelet peer: tests.kubelet_peer)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podwire.config import DevicePluginSettings
from podwire.deviceplugin import DevicePlugin
from tests.kubelet_peer import KubeletPeer


@pytest.fixture
def short_root() -> Iterator[Path]:
    """Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer."""
    root = Path(tempfile.mkdtemp(prefix="pw-dp-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def kubelet(short_root: Path) -> AsyncIterator[KubeletPeer]:
    fake = KubeletPeer(short_root, "podwire.io/memif")
    await fake.start()
    await fake.start_pod_resources()
    yield fake
    await fake.stop()


def make_settings(root: Path, **overrides: Any) -> DevicePluginSettings:
    values: dict[str, Any] = {
        "enabled": True,
        "resource_name": "podwire.io/memif",
        "devices": 8,
        "device_plugins_dir": str(root / "device-plugins"),
        "pod_resources_socket": str(root / "pod-resources" / "kubelet.sock"),
        "memif_host_dir": str(root / "memif"),
        "memif_container_dir": "/run/vpp",
        "checkpoint": str(root / "state" / "memif-checkpoint.json"),
    }
    values.update(overrides)
    return DevicePluginSettings(**values)


class RunningPlugin:
    def __init__(self, plugin: DevicePlugin, task: asyncio.Task[None]) -> None:
        self.plugin = plugin
        self.task = task

    async def stop(self) -> None:
        if self.task.done():
            # Its outcome (a start-up error) was already checked by the test.
            if not self.task.cancelled():
                self.task.exception()
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


StartPlugin = Callable[..., Awaitable[RunningPlugin]]


@pytest.fixture
async def start_plugin(short_root: Path) -> AsyncIterator[StartPlugin]:
    """Start ``DevicePlugin.run()`` as a task and wait until kubelet accepted it."""
    running: list[RunningPlugin] = []

    async def start(
        wait: bool = True, reconcile_grace: float = 3600.0, **overrides: Any
    ) -> RunningPlugin:
        plugin = DevicePlugin(
            make_settings(short_root, **overrides),
            reconcile_interval=3600,
            reconcile_grace=reconcile_grace,
            watch_interval=0.02,
            rpc_timeout=2.0,
            register_backoff_max=0.05,
        )
        task = asyncio.create_task(plugin.run())
        handle = RunningPlugin(plugin, task)
        running.append(handle)
        if wait:
            async with asyncio.timeout(10):
                registered = asyncio.create_task(plugin.wait_registered())
                await asyncio.wait({registered, task}, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    registered.cancel()
                    task.result()
        return handle

    yield start
    for handle in running:
        await handle.stop()


def dirs_in(path: str | os.PathLike[str]) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
