"""The device plugin inside the agent: a part whose failures must never stop CNI.

Alone (``podwire deviceplugin``), a refused registration or a missing kubelet directory ends
the process, and its supervisor restarts it. Inside the agent the same failure would end the
agent's task group, CNI with it, so here it is logged, reported (readiness stays ready, naming
the problem) and retried with the one backoff helper until kubelet is there again.
"""

from __future__ import annotations

import asyncio

from podwire.backoff import Backoff, retry_forever
from podwire.deviceplugin import DevicePlugin
from podwire.errors import PodwireError
from podwire.health import Health

RETRY = Backoff(0.5, 10.0)


class EmbeddedPlugin:
    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin
        self.health = Health("device plugin")

    async def run(self) -> None:
        await retry_forever("deviceplugin", self._serve, RETRY, self.health, retried=PodwireError)

    async def _serve(self) -> None:
        reporter = asyncio.create_task(self._healthy_once_registered())
        try:
            await self.plugin.run()
        finally:
            reporter.cancel()

    async def _healthy_once_registered(self) -> None:
        await self.plugin.wait_registered()
        self.health.ok()
