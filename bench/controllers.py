"""A controller in the bench's own event loop, serving before the bench goes on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from podwire.config import Settings
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect


@contextlib.asynccontextmanager
async def serving_controller(settings: Settings, etcd: EtcdClient) -> AsyncIterator[Controller]:
    controller = Controller(settings, etcd, connect(settings.neutron))
    task = asyncio.create_task(controller.run())
    try:
        async with asyncio.timeout(120):
            while not controller.service.serving:
                if task.done():
                    task.result()  # it failed: say why
                await asyncio.sleep(0.05)
        yield controller
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
