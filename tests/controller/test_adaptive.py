"""Adaptive pools against the real stack: a step from 0 to 5 pods/s and back to 0.

The pool must grow while the burst goes on (ahead of it: most requests are hits although the
pool started at min), then fall back to ``pool.min`` once it has been idle for the TTL.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ADMIN,
    ScriptedNodes,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)
from tests.scripted_agent import eventually

RATE = 5.0  # pods per second
BURST_SECONDS = 6.0
POD_LIFETIME = 1.0
TTL = 4.0


async def test_pool_grows_with_a_burst_and_shrinks_after_the_ttl(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    settings = settings_for(
        stack,
        [node],
        min=1,
        batch=5,
        update_interval=0.5,
        recycle_on_release=True,  # released ports come back at once
        adaptive=True,
        idle_ttl=TTL,
        rate_window=1.0,
    )
    running = await controllers(settings)
    service = running.service
    key = PoolKey(node.name, network.project_id, network.id)
    # one pod first, so the pool exists and Neutron's bulk-create time is measured
    status, body = await request_vif(http, running.url, node, vif_body("warm:eth0", network))
    assert status == 200, body
    assert await release_vif(http, running.url, node, "warm:eth0") == 204
    await service.drain()

    targets: list[int] = []
    sizes: list[int] = []
    misses_before = service.metrics.misses._value.get()

    async def pod(n: int) -> None:
        status, body = await request_vif(http, running.url, node, vif_body(f"p{n}:eth0", network))
        assert status == 200, body
        await asyncio.sleep(POD_LIFETIME)
        assert await release_vif(http, running.url, node, f"p{n}:eth0") == 204

    pods = []
    for n in range(int(RATE * BURST_SECONDS)):
        pods.append(asyncio.create_task(pod(n)))
        snap = service.snapshot(key)
        targets.append(snap.target.size)
        sizes.append(snap.size)
        await asyncio.sleep(1 / RATE)
    await asyncio.gather(*pods)
    misses = service.metrics.misses._value.get() - misses_before

    # ahead of the burst: the target rose above min during it and the pool held ports for it
    assert max(targets) > 1, targets
    assert max(sizes[len(sizes) // 2 :]) > 1, sizes
    assert misses <= len(pods) // 3, (misses, targets, sizes)
    shown = await _admin_pool(http, running.url, key)
    assert shown["sizing"]["reason"]

    # back to 0 pods/s: the recycled ports wait, then after the TTL the pool is at min again
    async def grown() -> bool:
        await asyncio.sleep(0)
        return service.pools.size(key) > 1

    await eventually(grown, "released ports back in the pool", timeout=10)

    async def at_min() -> bool:
        return service.pools.size(key) == 1 and not service.pools.recyclable()

    await eventually(at_min, "the idle pool shrunk to pool.min", timeout=TTL + 10)
    snap = service.snapshot(key)
    assert snap.target.size == 1 and "idle" in snap.target.reason, snap.target

    async def deleted_in_neutron() -> bool:
        ours = await asyncio.to_thread(
            lambda: [
                p
                for p in neutron.network.ports(network_id=network.id)
                if p.binding_host_id == node.name and p.device_owner == "compute:podwire"
            ]
        )
        return len(ours) == 1  # the surplus is deleted in Neutron, not only forgotten

    await eventually(deleted_in_neutron, "the surplus deleted in Neutron", timeout=30)


async def _admin_pool(http: aiohttp.ClientSession, base: str, key: PoolKey) -> Any:
    url = f"{base}/v1/pools/{key.node}/{key.project_id}/{key.network_id}"
    async with http.get(url, headers={"Authorization": f"Bearer {ADMIN}"}) as response:
        assert response.status == 200
        return await response.json()
