"""Pools agree with Neutron: how long a pooled port stays in its pool after Neutron deleted it
(or keeps its old address after a re-address), counted from the moment the Neutron call
returns, with the controller in-process following the forwarder's mirror. The reference is the
Neutron call itself, in the same run. Target: out of the pool p99 <= 1 s.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.controllers import QUIET_POOL, controller_settings, register_node, serving_controller
from bench.harness import delete_project, forget_nodes, project_network, stack_etcd, until
from bench.stats import row
from podwire.controller.app import Controller
from podwire.neutron.client import neutron_connection
from podwire.schema.inuse import PoolKey

POLL = 0.001
GIVE_UP = 30.0


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_run(stack, max(10, min(samples, 100))))


async def _run(stack: dict[str, Any], count: int) -> list[dict[str, Any]]:
    etcd = await stack_etcd(stack)
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    net, subnet = project_network(conn, project, "bench-sync", "10.97.0.0/20")
    node = f"bench-{uuid.uuid4().hex[:8]}"
    await register_node(etcd, node)
    try:
        async with serving_controller(
            controller_settings(stack, {node: node}, QUIET_POOL), etcd
        ) as ctl:
            try:
                return await _measure(ctl, conn, PoolKey(node, project, net.id), subnet.id, count)
            finally:
                await ctl.admin.free_nodes([node])
    finally:
        await forget_nodes(etcd, node)
        await etcd.close()
        delete_project(conn, project)


async def _measure(
    ctl: Controller, conn: Any, key: PoolKey, subnet_id: str, count: int
) -> list[dict[str, Any]]:
    await ctl.admin.populate([key.node], key.network_id, key.project_id, [], 2 * count)
    pools = ctl.service.pools
    await until(lambda: not pools.unseen(key) and pools.size(key) == 2 * count, GIVE_UP, POLL)
    ports = sorted(p for _, ports in pools.groups(key) for p in ports)
    readdressed = []
    for index, port_id in enumerate(ports[count:]):
        address = f"10.97.15.{index + 1}"
        fixed_ips = [{"subnet_id": subnet_id, "ip_address": address}]

        def current(p: str = port_id, a: str = address) -> bool:
            vif = ctl.service.pools.vif(p)
            return vif is not None and [ip.ip_address for ip in vif.fixed_ips] == [a]

        update = partial(conn.network.update_port, port_id, fixed_ips=fixed_ips)
        readdressed.append(await _after_call(update, current))
    deleted = []
    for port_id in ports[:count]:
        delete = partial(conn.network.delete_port, port_id)
        deleted.append(await _after_call(delete, lambda p=port_id: not ctl.service.pools.known(p)))
    return [
        row(name, [ms for ms, _ in taken], reference, [call for _, call in taken])
        for name, reference, taken in (
            (
                "pool sync: pooled port out of its pool after Neutron's delete returns",
                "the Neutron port delete call",
                deleted,
            ),
            (
                "pool sync: pooled port re-read after Neutron's re-address returns",
                "the Neutron port update call",
                readdressed,
            ),
        )
    ]


async def _after_call(call: Callable[[], object], done: Callable[..., bool]) -> tuple[float, float]:
    """ms from the Neutron ``call``'s return until the pool agrees (``done``), and of the
    call itself."""
    started = time.perf_counter()
    await asyncio.to_thread(call)
    returned = time.perf_counter()
    await until(done, GIVE_UP, POLL, what="the pool agreeing with Neutron")
    return (time.perf_counter() - returned) * 1000, (returned - started) * 1000
