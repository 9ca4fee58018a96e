"""Restart recovery (its two sources: test_recovery), removed nodes, SG reuse, max, network
deletion, standby."""

from __future__ import annotations

from typing import Any

import aiohttp

from podwire.config import ControllerSettings
from podwire.controller.recycler import recycle_once
from podwire.etcd.client import EtcdClient
from podwire.schema.inuse import PoolKey
from podwire.status.report import collect_pools
from tests.controller.conftest import (
    ADMIN,
    ScriptedNodes,
    admin,
    eventually,
    pooled_ports,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)


async def test_restart_recovers_pools_and_in_use(
    stack: dict[str, Any],
    etcd: EtcdClient,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    settings = settings_for(stack, [node], min=2, batch=4)
    first = await controllers(settings)
    _, used = await request_vif(http, first.url, node, vif_body("u1:eth0", network))
    await first.service.drain()
    key = PoolKey(node.name, network.project_id, network.id)
    free = pooled_ports(first, key)
    assert len(free) == 3
    await first.stop()
    second = await controllers(settings)
    recovered = pooled_ports(second, key)
    assert recovered == free
    assert used["vif"]["port_id"] not in recovered
    _, again = await request_vif(http, second.url, node, vif_body("u1:eth0", network))
    assert again["vif"] == used["vif"]
    # a released recovered port is recycled like any other
    assert await release_vif(http, second.url, node, "u1:eth0") == 204
    assert await recycle_once(second.service, second.controller.neutron, settings.pool) == (1, 0)


async def test_sg_reuse_remove_sg_max_and_network_deletion(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
    sgs: list[str],
) -> None:
    node = await nodes.add()
    settings = settings_for(stack, [node], min=0, max=2, batch=2)
    running = await controllers(settings)
    status, body = await admin(
        http,
        "POST",
        running.url + "/v1/pools/populate",
        {"nodes": [node.name], "network": network.id, "security_groups": [sgs[0]], "count": 2},
    )
    assert status == 200 and body == {"created": {node.name: 2}}
    key = PoolKey(node.name, network.project_id, network.id)
    status, shown = await admin(
        http, "GET", f"{running.url}/v1/pools/{node.name}/{network.project_id}/{network.id}"
    )
    assert (
        status == 200 and shown["size"] == 2 and shown["groups"][0]["security_groups"] == [sgs[0]]
    )
    # another SG set: reuse of an existing port with one port update
    _, got = await request_vif(http, running.url, node, vif_body("r:eth0", network, [sgs[1]]))
    port = neutron.network.get_port(got["vif"]["port_id"])
    assert port.security_group_ids == [sgs[1]] and got["vif"]["security_groups"] == [sgs[1]]
    # what `podwire status` shows of this pool: one free, one in use, refilled once
    status_settings = ControllerSettings(
        listen=running.url.removeprefix("http://"), admin_token=ADMIN
    )
    (seen,) = (await collect_pools(status_settings))["pools"]
    assert (seen["size"], seen["in_use"], seen["recyclable"]) == (1, 1, 0)
    assert seen["last_refill"] is not None
    # removing an SG from the pools strips it from the pooled ports
    status, moved = await admin(http, "DELETE", f"{running.url}/v1/security-groups/{sgs[0]}/pools")
    assert status == 200 and moved == {"moved": 1}
    (pooled,) = pooled_ports(running, key)
    assert neutron.network.get_port(pooled).security_group_ids == []
    # max: fill to 2, then a released port is deleted instead of pooled
    await admin(
        http,
        "POST",
        running.url + "/v1/pools/populate",
        {"nodes": [node.name], "network": network.id, "count": 1},
    )
    assert running.service.pools.size(key) == 2
    await release_vif(http, running.url, node, "r:eth0")
    (seen,) = (await collect_pools(status_settings))["pools"]
    assert (seen["in_use"], seen["recyclable"]) == (0, 1)
    assert await recycle_once(running.service, running.controller.neutron, settings.pool) == (0, 1)
    assert neutron.network.find_port(got["vif"]["port_id"]) is None
    # network deletion frees its pools and their ports
    status, freed = await admin(http, "DELETE", f"{running.url}/v1/networks/{network.id}/pools")
    assert status == 200 and freed == {"freed": 2}
    assert list(neutron.network.ports(network_id=network.id)) == []
    assert (await admin(http, "GET", f"{running.url}/v1/pools"))[1] == {"pools": []}


async def test_removed_node_cleanup_needs_two_passes(
    stack: dict[str, Any],
    etcd: EtcdClient,
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    live, dying = await nodes.add(), await nodes.add()
    running = await controllers(settings_for(stack, [live, dying], min=0))
    for node in (live, dying):
        await admin(
            http,
            "POST",
            running.url + "/v1/pools/populate",
            {"nodes": [node.name], "network": network.id, "count": 1},
        )
    await nodes.kill(dying)
    assert await running.controller.sweeper.sweep_once() == (set(), 0)
    freed, _ = await running.controller.sweeper.sweep_once()
    assert freed == {dying.name}
    assert {k.node for k in running.service.pools.pool_keys()} == {live.name}
    assert list(neutron.network.ports(binding_host_id=dying.name)) == []


async def test_standby_takes_over(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    settings = settings_for(stack, [node], min=1, batch=1)
    leader = await controllers(settings)
    standby = await controllers(settings, wait_ready=False)
    async with http.get(standby.url + "/readyz") as response:
        assert response.status == 503
    status, body = await request_vif(http, standby.url, node, vif_body("s:eth0", network))
    assert status == 503 and body["retryable"] is True
    _, used = await request_vif(http, leader.url, node, vif_body("s:eth0", network))
    await leader.stop()
    await eventually(lambda: _serving(standby), "standby took over")
    _, again = await request_vif(http, standby.url, node, vif_body("s:eth0", network))
    assert again["vif"] == used["vif"]


async def _serving(running: Any) -> bool:
    return bool(running.service.serving)
