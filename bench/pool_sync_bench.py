"""Pools agree with Neutron: how long a pooled port stays in its pool after Neutron deleted it
(or keeps its old address after a re-address), counted from the moment the Neutron call
returns, with the controller in-process following the forwarder's mirror. The reference is the
Neutron call itself, in the same run. Target: out of the pool p99 <= 1 s.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from typing import Any

from bench.controllers import serving_controller
from bench.stats import row
from podwire import keys
from podwire.config import ControllerSettings, EtcdSettings, NeutronSettings, PoolSettings, Settings
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import neutron_connection
from podwire.schema.inuse import PoolKey
from tests.etcd_tools import delete_prefix

POLL = 0.001
GIVE_UP = 30.0


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_run(stack, max(10, min(samples, 100))))


async def _run(stack: dict[str, Any], count: int) -> list[dict[str, Any]]:
    etcd = await EtcdClient.connect(EtcdSettings(endpoints=[stack["etcd"]]))
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    net = conn.network.create_network(project_id=project, name="bench-sync")
    subnet = conn.network.create_subnet(
        project_id=project, network_id=net.id, cidr="10.97.0.0/20", ip_version=4
    )
    node = f"bench-{uuid.uuid4().hex[:8]}"
    await _register(etcd, node)
    try:
        async with serving_controller(_settings(stack, node), etcd) as ctl:
            try:
                return await _measure(ctl, conn, PoolKey(node, project, net.id), subnet.id, count)
            finally:
                await ctl.admin.free_nodes([node])
    finally:
        await delete_prefix(etcd, keys.state_node_prefix(node))
        await delete_prefix(etcd, keys.vifs_prefix(node))
        await etcd.close()
        for port in list(conn.network.ports(project_id=project)):
            conn.network.delete_port(port)
        conn.network.delete_network(net)


async def _measure(
    ctl: Controller, conn: Any, key: PoolKey, subnet_id: str, count: int
) -> list[dict[str, Any]]:
    ports = await _pool(ctl, key, 2 * count)
    readdressed = await _readdress(ctl, conn, subnet_id, ports[count:])
    deleted = await _delete(ctl, conn, ports[:count])
    return [
        row(
            "pool sync: pooled port out of its pool after Neutron's delete returns",
            deleted[0],
            "the Neutron port delete call",
            deleted[1],
        ),
        row(
            "pool sync: pooled port re-read after Neutron's re-address returns",
            readdressed[0],
            "the Neutron port update call",
            readdressed[1],
        ),
    ]


async def _register(etcd: EtcdClient, node: str) -> None:
    await etcd.put(keys.state_vtep(node), b'{"v":1,"ip":"192.0.2.10"}')
    caps = {"v": 1, "vif_types": ["veth"], "network_types": ["vxlan"]}
    await etcd.put(keys.state_capabilities(node), json.dumps(caps).encode())
    lease = await etcd.grant_lease(3600)
    alive = json.dumps({"v": 1, "started_at": time.time(), "version": "bench"}).encode()
    await etcd.put(keys.state_alive(node), alive, lease=lease.id)


def _settings(stack: dict[str, Any], node: str) -> Settings:
    return Settings(
        etcd=EtcdSettings(endpoints=[stack["etcd"]]),
        neutron=NeutronSettings(endpoint=stack["neutron"]),
        controller=ControllerSettings(
            listen="127.0.0.1:0", admin_token="a", node_tokens={node: node}
        ),
        pool=replace(
            PoolSettings(),
            min=0,
            batch=50,
            adaptive=False,
            update_interval=3600.0,
            node_cleanup_interval=3600.0,
        ),
    )


async def _pool(ctl: Controller, key: PoolKey, count: int) -> list[str]:
    await ctl.admin.populate([key.node], key.network_id, key.project_id, [], count)
    pools = ctl.service.pools
    await _until(lambda: not pools.unseen(key) and pools.size(key) == count)
    return sorted(p for _, ports in pools.groups(key) for p in ports)


async def _delete(ctl: Controller, conn: Any, ports: list[str]) -> tuple[list[float], list[float]]:
    gone, calls = [], []
    for port_id in ports:
        started = time.perf_counter()
        await asyncio.to_thread(conn.network.delete_port, port_id)
        returned = time.perf_counter()
        await _until(lambda p=port_id: not ctl.service.pools.known(p))  # type: ignore[misc]
        gone.append((time.perf_counter() - returned) * 1000)
        calls.append((returned - started) * 1000)
    return gone, calls


async def _readdress(
    ctl: Controller, conn: Any, subnet_id: str, ports: list[str]
) -> tuple[list[float], list[float]]:
    current, calls = [], []
    for index, port_id in enumerate(ports):
        address = f"10.97.15.{index + 1}"
        fixed_ips = [{"subnet_id": subnet_id, "ip_address": address}]
        started = time.perf_counter()
        await asyncio.to_thread(conn.network.update_port, port_id, fixed_ips=fixed_ips)
        returned = time.perf_counter()

        def readdressed(p: str = port_id, a: str = address) -> bool:
            vif = ctl.service.pools.vif(p)
            return vif is not None and [ip.ip_address for ip in vif.fixed_ips] == [a]

        await _until(readdressed)
        current.append((time.perf_counter() - returned) * 1000)
        calls.append((returned - started) * 1000)
    return current, calls


async def _until(done: Any) -> None:
    give_up = time.monotonic() + GIVE_UP
    while not done():
        if time.monotonic() > give_up:
            raise TimeoutError("pool sync bench: the pool never agreed with Neutron")
        await asyncio.sleep(POLL)
