"""Noticing a kubelet restart: it deletes our socket and re-creates its own ``kubelet.sock``.

Polling two ``lstat`` calls every 100 ms costs nothing measurable and needs no inotify binding;
it bounds detection at one interval, well inside the one-second re-registration target.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path


def identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


class KubeletRestartWatcher:
    def __init__(self, plugin_socket: Path, kubelet_socket: Path, *, interval: float = 0.1) -> None:
        self.plugin_socket = plugin_socket
        self.kubelet_socket = kubelet_socket
        self.interval = interval
        self._plugin: tuple[int, int] | None = None
        self._kubelet: tuple[int, int] | None = None

    def arm(self) -> None:
        """Remember both sockets as they are right after a successful registration."""
        self._plugin = identity(self.plugin_socket)
        self._kubelet = identity(self.kubelet_socket)

    def check(self) -> str | None:
        plugin = identity(self.plugin_socket)
        if plugin is None:
            return "plugin socket removed"
        if plugin != self._plugin:
            return "plugin socket replaced"
        kubelet = identity(self.kubelet_socket)
        if kubelet is None:
            return "kubelet.sock removed"
        if kubelet != self._kubelet:
            return "kubelet.sock re-created"
        return None

    async def wait(self) -> str:
        while True:
            reason = self.check()
            if reason is not None:
                return reason
            await asyncio.sleep(self.interval)
