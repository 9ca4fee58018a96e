"""A removed node releases everything: ``remove_node`` for a node with 110 pods (Kubernetes'
default pods per node) in use and a warm pool, until every port of it is gone from Neutron and
every in-use record from etcd. The reference is deleting the same number of ports straight
through Neutron with the same concurrency, in the same run. Target: p99 <= 5 s.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.controllers import QUIET_POOL, controller_settings, register_node, serving_controller
from bench.harness import delete_project, forget_nodes, project_network, stack_etcd
from bench.stats import row
from podwire import keys
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import neutron_connection
from podwire.schema.vif import VifRequest

PODS = 110
WARM = 10  # free pool ports the node also holds
DELETE_CONCURRENCY = 10  # what the controller's delete_ports uses


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_run(stack, max(3, min(samples, 5))))


async def _run(stack: dict[str, Any], count: int) -> list[dict[str, Any]]:
    etcd = await stack_etcd(stack)
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    net, _ = project_network(conn, project, "bench-release", "10.98.0.0/20")
    ours, reference = [], []
    try:
        for _ in range(count):
            ours.append(await _one_node(stack, etcd, conn, net.id, project))
            reference.append(await asyncio.to_thread(_plain_deletes, conn, net.id, project))
    finally:
        await etcd.close()
        delete_project(conn, project)
    return [
        row(
            f"node removed: {PODS} pods' ports + {WARM} pooled released (Neutron, etcd)",
            ours,
            f"{PODS + WARM} Neutron port deletes, {DELETE_CONCURRENCY} at a time",
            reference,
        )
    ]


async def _one_node(
    stack: dict[str, Any], etcd: EtcdClient, conn: Any, network_id: str, project: str
) -> float:
    node = f"bench-{uuid.uuid4().hex[:8]}"
    await register_node(etcd, node)
    try:
        async with serving_controller(
            controller_settings(stack, {node: node}, QUIET_POOL), etcd
        ) as ctl:
            return await _release(ctl, conn, etcd, node, network_id, project)
    finally:
        await forget_nodes(etcd, node)


async def _release(
    ctl: Controller, conn: Any, etcd: EtcdClient, node: str, network_id: str, project: str
) -> float:
    await ctl.admin.populate([node], network_id, project, [], PODS + WARM)
    for index in range(PODS):
        request = VifRequest(f"c{index}:eth0", network_id, project, ())
        await ctl.broker.request(node, request)
    started = time.perf_counter()
    released = await ctl.broker.remove_node(node, "removed")
    elapsed = (time.perf_counter() - started) * 1000
    left = [p for p in conn.network.ports(network_id=network_id) if p.binding_host_id == node]
    records, _ = await etcd.get_prefix(keys.vifs_prefix(node))
    if len(released) != PODS or left or records:
        problem = f"{len(left)} ports, {len(records)} records left"
        raise RuntimeError(f"node release bench: {problem}")
    return elapsed


def _plain_deletes(conn: Any, network_id: str, project: str) -> float:
    body = {"network_id": network_id, "project_id": project}
    ports = conn.network.create_ports([body] * (PODS + WARM))
    started = time.perf_counter()
    with ThreadPoolExecutor(DELETE_CONCURRENCY) as pool:
        list(pool.map(conn.network.delete_port, ports))
    return (time.perf_counter() - started) * 1000
