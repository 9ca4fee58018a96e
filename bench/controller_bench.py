"""Controller bench: warm-pool request rate, 50 pods with pools vs unpooled (recovery: its own).

Runs in-process against the bench stack: the service layer (pool take + etcd in-use record,
no HTTP), which is what a request costs inside the controller.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any

from bench.controllers import QUIET_POOL, controller_settings, register_node, serving_controller
from bench.harness import forget_nodes, project_network, stack_etcd
from bench.stats import row, timed
from podwire.controller.app import Controller
from podwire.controller.recycler import recycle_once
from podwire.neutron.client import neutron_connection
from podwire.schema.vif import VifRequest
from tests.neutron_calls import neutron_call_count

WARM_PORTS = 200


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_run(stack, samples))


async def _run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    etcd = await stack_etcd(stack)
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    conn.network.update_quota(project, ports=-1)  # recovery sizes exceed the default 500
    net, _ = project_network(conn, project, "bench-ctl", "10.96.0.0/16")
    nodes = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for node, driver in zip(nodes, ("baremetal", "unpooled", "baremetal"), strict=True):
        await register_node(etcd, node, driver)
    settings = controller_settings(stack, {n: n for n in nodes}, replace(QUIET_POOL, adaptive=True))
    try:
        async with serving_controller(settings, etcd) as ctl:
            try:
                return await _warm_and_pods(ctl, net, nodes, max(3, min(samples, 20)))
            finally:
                await ctl.admin.free_nodes([nodes[0]])
    finally:
        await forget_nodes(etcd, *nodes)
        await etcd.close()


async def _warm_and_pods(
    ctl: Controller, net: Any, nodes: list[str], rounds: int
) -> list[dict[str, Any]]:
    service, broker = ctl.service, ctl.broker
    await ctl.admin.populate([nodes[0]], net.id, net.project_id, [], WARM_PORTS)
    rates, calls = [], 0.0
    for r in range(rounds):
        reqs = [VifRequest(f"w{r}-{i}:eth0", net.id, net.project_id, ()) for i in range(WARM_PORTS)]
        before = neutron_call_count(ctl.metrics)
        started = time.perf_counter()
        await asyncio.gather(*(broker.request(nodes[0], q) for q in reqs))
        rates.append(WARM_PORTS / (time.perf_counter() - started))
        calls += neutron_call_count(ctl.metrics) - before
        await asyncio.gather(*(broker.release(nodes[0], q.attachment) for q in reqs))
        await recycle_once(service, ctl.neutron, ctl.settings.pool)
    pools_ms, unpooled_ms = [], []
    for r in range(min(rounds, 3)):
        pools_ms.append(await _fifty(broker, nodes[0], net, f"pp{r}"))
        unpooled_ms.append(await _fifty(broker, nodes[1], net, f"np{r}"))
        await recycle_once(service, ctl.neutron, ctl.settings.pool)
    return [
        row(
            f"controller: warm requests/s ({calls / (rounds * WARM_PORTS):.0f}"
            " Neutron calls/request)",
            rates,
            unit="req/s",
        ),
        row(
            "controller: 50 pods attached on one node (pools)",
            pools_ms,
            "unpooled driver (a port created per pod)",
            unpooled_ms,
        ),
    ]


async def _fifty(broker: Any, node: str, net: Any, tag: str) -> float:
    reqs = [VifRequest(f"{tag}-{i}:eth0", net.id, net.project_id, ()) for i in range(50)]
    elapsed = await timed(asyncio.gather, *(broker.request(node, q) for q in reqs))
    await asyncio.gather(*(broker.release(node, q.attachment) for q in reqs))
    return elapsed
