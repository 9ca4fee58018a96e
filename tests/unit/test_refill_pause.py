"""The top-up a request starts: deferred while a burst goes on, at once below the floor.

A fake driver records when Neutron would be asked; test_adaptive.py runs the pools against
the real stack, bench/cri_bench.py measures what the deferral buys under containerd.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

from podwire.config import PoolSettings
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.pools import Pools
from podwire.controller.refill import Refiller
from podwire.schema.inuse import PoolKey
from podwire.schema.ports import FixedIp
from podwire.schema.vif import Vif

KEY = PoolKey("n1", "proj", "net")
NETWORK: Any = SimpleNamespace(id="net")  # what a refill reads of the pool's network


def _vif() -> Vif:
    return Vif(
        port_id=str(uuid.uuid4()),
        network_id="net",
        project_id="proj",
        mac_address="fa:16:3e:00:00:01",
        mtu=1450,
        fixed_ips=[FixedIp("10.0.0.5", "s", "10.0.0.0/24", "10.0.0.1")],
        security_groups=[],
    )


@dataclass
class Driver:
    created_at: list[float] = field(default_factory=list)
    pooled: bool = True

    async def create(self, key: PoolKey, sgs: Any, count: int, network: Any) -> list[Vif]:
        self.created_at.append(time.monotonic())
        return [_vif() for _ in range(count)]


class Alive:
    async def may_refill(self, node: str) -> bool:
        return True


def _refiller(settings: PoolSettings, ready: int) -> tuple[Refiller, Pools]:
    pools = Pools()
    pools.add(KEY, [_vif() for _ in range(ready)])
    refiller = Refiller(pools, settings, ControllerMetrics(), cast(Any, Alive()))
    refiller.sizer.bulk_created(1.0)
    return refiller, pools


def _take(refiller: Refiller, pools: Pools) -> None:
    refiller.sizer.request(KEY, time.monotonic())
    assert pools.take(KEY, ()) is not None


async def test_a_burst_the_pool_covers_is_topped_up_only_once_it_pauses() -> None:
    settings = PoolSettings(min=1, batch=2, refill_pause=0.3)
    refiller, pools = _refiller(settings, ready=12)
    driver = Driver()
    _take(refiller, pools)
    top_ups = [asyncio.create_task(refiller.top_up(KEY, (), cast(Any, driver), NETWORK))]
    for _ in range(8):  # the burst goes on: every request would start a top-up
        await asyncio.sleep(0.05)
        _take(refiller, pools)
        top_ups.append(asyncio.create_task(refiller.top_up(KEY, (), cast(Any, driver), NETWORK)))
    last_request = time.monotonic()
    assert driver.created_at == []  # nothing asked of Neutron during the burst
    created = await asyncio.gather(*top_ups)
    assert sum(1 for c in created if c) == 1  # one top-up (its batches are bulk creates)
    assert driver.created_at
    assert min(driver.created_at) >= last_request + settings.refill_pause - 0.01


async def test_below_the_floor_it_refills_at_once() -> None:
    refiller, pools = _refiller(PoolSettings(min=3, batch=2, refill_pause=3600.0), ready=3)
    driver = Driver()
    _take(refiller, pools)  # 2 left, under pool.min
    async with asyncio.timeout(10):  # not after the hour-long pause
        assert await refiller.top_up(KEY, (), cast(Any, driver), NETWORK) > 0


async def test_no_pause_tops_up_after_every_request() -> None:
    refiller, pools = _refiller(PoolSettings(min=1, batch=2, refill_pause=0.0), ready=4)
    driver = Driver()
    for _ in range(3):
        _take(refiller, pools)
    assert refiller.short(KEY)
    async with asyncio.timeout(10):
        assert await refiller.top_up(KEY, (), cast(Any, driver), NETWORK) > 0
