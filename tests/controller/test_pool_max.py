"""``pool.max`` holds whatever the order of requests, refills and release bursts (the real
controller, Neutron and forwarder, prompt recycling and adaptive sizing as configured by
default)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ScriptedNodes,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)
from tests.scripted_agent import eventually

MAX = 3


async def test_release_bursts_never_leave_more_than_max_free(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    settings = settings_for(
        stack, [node], min=1, max=MAX, batch=MAX, recycle_on_release=True, adaptive=True
    )
    running = await controllers(settings)
    service = running.service
    key = PoolKey(node.name, network.project_id, network.id)

    async def post(name: str) -> None:
        status, body = await request_vif(http, running.url, node, vif_body(name, network))
        assert status == 200, body

    async def delete(name: str) -> None:
        assert await release_vif(http, running.url, node, name) == 204

    for burst in range(3):
        first = [f"b{burst}-a{i}:eth0" for i in range(2 * MAX)]
        await asyncio.gather(*(post(name) for name in first))
        # more requests while the first ones are released: refills and recycling overlap
        second = [f"b{burst}-b{i}:eth0" for i in range(2 * MAX)]
        await asyncio.gather(*(post(n) for n in second), *(delete(n) for n in first))
        await asyncio.gather(*(delete(name) for name in second))
        await service.drain()
        await eventually(lambda: _settled(service), "released ports recycled", timeout=30)
        assert service.pool_size(key) <= MAX, f"burst {burst}: {service.pool_size(key)} free"


async def _settled(service: Any) -> bool:
    await service.drain()
    return not service.pools.recyclable()
