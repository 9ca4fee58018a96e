"""When to tell the device plugin that a pod is gone.

CNI has no "pod deleted" verb: a DEL also happens when kubelet re-creates a pod's sandbox, and
the pod then keeps its memif grant. So a DEL that removes a pod's last attachment only
schedules the release; an ADD for the same pod within the grace period cancels it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from podwire.errors import PodwireError
from podwire.log import get_logger

log = get_logger(__name__)

ReleasePod = Callable[[str, str], Awaitable[int]]


class PodReleaser:
    def __init__(self, release: ReleasePod, grace: float) -> None:
        self._release = release
        self._grace = grace
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        """Own the scheduled releases in a TaskGroup, so an unexpected failure is not lost."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            try:
                await asyncio.Event().wait()
            finally:
                self._group = None

    def schedule(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self.cancel(namespace, name)
        if self._group is None:  # stopping: reconciliation with kubelet releases it later
            log.info("agent.pod_release.skipped", namespace=namespace, pod=name)
            return
        self._pending[key] = self._group.create_task(self._later(key))

    def cancel(self, namespace: str, name: str) -> None:
        task = self._pending.pop((namespace, name), None)
        if task is not None:
            task.cancel()

    async def _later(self, key: tuple[str, str]) -> None:
        await asyncio.sleep(self._grace)
        self._pending.pop(key, None)
        try:
            released = await self._release(*key)
        except PodwireError as exc:
            log.warning("agent.pod_release.failed", namespace=key[0], pod=key[1], error=str(exc))
            return
        log.info("agent.pod_release", namespace=key[0], pod=key[1], grants=released)

    async def close(self) -> None:
        tasks = list(self._pending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pending.clear()
