"""Controller bench: warm-pool request rate, 50 pods with pools vs unpooled (recovery: its own).

Runs in-process against the bench stack: the service layer (pool take + etcd in-use record,
no HTTP), which is what a request costs inside the controller.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from typing import Any

from bench.stats import row
from podwire import keys
from podwire.config import ControllerSettings, EtcdSettings, NeutronSettings, PoolSettings, Settings
from podwire.controller.app import Controller
from podwire.controller.recycler import recycle_once
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect, neutron_connection
from podwire.schema.vif import VifRequest
from tests.etcd_tools import delete_prefix
from tests.neutron_calls import neutron_call_count

WARM_PORTS = 200


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_run(stack, samples))


async def _run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    etcd = await EtcdClient.connect(EtcdSettings(endpoints=[stack["etcd"]]))
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    conn.network.update_quota(project, ports=-1)  # recovery sizes exceed the default 500
    net = conn.network.create_network(project_id=project, name="bench-ctl")
    conn.network.create_subnet(
        project_id=project, network_id=net.id, cidr="10.96.0.0/16", ip_version=4
    )
    nodes = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for node, driver in zip(nodes, ("baremetal", "unpooled", "baremetal"), strict=True):
        await _register(etcd, node, driver)
    try:
        return await _warm_and_pods(stack, etcd, net, nodes, max(3, min(samples, 20)))
    finally:
        for node in nodes:
            await delete_prefix(etcd, keys.state_node_prefix(node))
            await delete_prefix(etcd, keys.vifs_prefix(node))
        await etcd.close()


async def _register(etcd: EtcdClient, node: str, driver: str) -> None:
    await etcd.put(keys.state_vtep(node), b'{"v":1,"ip":"192.0.2.10"}')
    caps = {"v": 1, "vif_types": ["veth"], "network_types": ["vxlan"], "pod_driver": driver}
    await etcd.put(keys.state_capabilities(node), json.dumps(caps).encode())
    lease = await etcd.grant_lease(3600)
    alive = json.dumps({"v": 1, "started_at": time.time(), "version": "bench"}).encode()
    await etcd.put(keys.state_alive(node), alive, lease=lease.id)


def _settings(stack: dict[str, Any], nodes: list[str]) -> Settings:
    return Settings(
        etcd=EtcdSettings(endpoints=[stack["etcd"]]),
        neutron=NeutronSettings(endpoint=stack["neutron"]),
        controller=ControllerSettings(
            listen="127.0.0.1:0", admin_token="a", node_tokens={n: n for n in nodes}
        ),
        pool=replace(
            PoolSettings(), min=0, batch=50, update_interval=3600.0, node_cleanup_interval=3600.0
        ),
    )


async def _started(stack: dict[str, Any], etcd: EtcdClient, nodes: list[str]) -> Any:
    settings = _settings(stack, nodes)
    ctl = Controller(settings, etcd, connect(settings.neutron))
    task = asyncio.create_task(ctl.run())
    while not ctl.service.serving:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    return ctl, task


async def _warm_and_pods(
    stack: dict[str, Any], etcd: EtcdClient, net: Any, nodes: list[str], rounds: int
) -> list[dict[str, Any]]:
    ctl, task = await _started(stack, etcd, nodes)
    service, broker = ctl.service, ctl.broker
    try:
        await ctl.admin.populate([nodes[0]], net.id, net.project_id, [], WARM_PORTS)
        rates, calls = [], 0.0
        for r in range(rounds):
            reqs = [
                VifRequest(f"w{r}-{i}:eth0", net.id, net.project_id, ()) for i in range(WARM_PORTS)
            ]
            before = neutron_call_count(ctl.metrics)
            started = time.perf_counter()
            await asyncio.gather(*(broker.request(nodes[0], q) for q in reqs))
            rates.append(WARM_PORTS / (time.perf_counter() - started))
            calls += neutron_call_count(ctl.metrics) - before
            await asyncio.gather(*(broker.release(nodes[0], q.attachment) for q in reqs))
            await recycle_once(service, ctl.neutron, ctl.settings.pool)
        rows = [
            row(
                f"controller: warm requests/s ({calls / (rounds * WARM_PORTS):.0f}"
                " Neutron calls/request)",
                rates,
                unit="req/s",
            )
        ]
        pools_ms, unpooled_ms = [], []
        for r in range(min(rounds, 3)):
            pools_ms.append(await _fifty(broker, nodes[0], net, f"pp{r}"))
            unpooled_ms.append(await _fifty(broker, nodes[1], net, f"np{r}"))
            await recycle_once(service, ctl.neutron, ctl.settings.pool)
        rows.append(
            row(
                "controller: 50 pods attached on one node (pools)",
                pools_ms,
                "unpooled driver (a port created per pod)",
                unpooled_ms,
            )
        )
        return rows
    finally:
        await ctl.admin.free_nodes([nodes[0]])
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _fifty(broker: Any, node: str, net: Any, tag: str) -> float:
    reqs = [VifRequest(f"{tag}-{i}:eth0", net.id, net.project_id, ()) for i in range(50)]
    started = time.perf_counter()
    await asyncio.gather(*(broker.request(node, q) for q in reqs))
    elapsed = (time.perf_counter() - started) * 1000
    await asyncio.gather(*(broker.release(node, q.attachment) for q in reqs))
    return elapsed
