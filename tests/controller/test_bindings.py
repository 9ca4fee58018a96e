"""Only ports podwire bound reach a pool: failed bindings are retried or deleted, and nodes
without a live agent get no ports (populate refuses them, refills skip them)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.controller.app import Controller
from podwire.controller.bindings import settle_bindings
from podwire.controller.recovery import recover
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect
from podwire.schema.inuse import PoolKey
from podwire.schema.vif import DEVICE_OWNER
from tests.controller.conftest import (
    Node,
    ScriptedNodes,
    admin,
    eventually,
    pooled_ports,
    request_vif,
    settings_for,
    vif_body,
)


def host_ports(neutron: Any, network: Any, host: str) -> list[Any]:
    return [p for p in neutron.network.ports(network_id=network.id) if p.binding_host_id == host]


async def ml2_binds(neutron: Any, network: Any, host: str, want: bool) -> None:
    """Wait until ml2's host cache agrees: a probe port on ``host`` binds (or fails to)."""

    async def probe() -> bool:
        port = neutron.network.create_port(
            network_id=network.id,
            project_id=network.project_id,
            binding_host_id=host,
            device_owner=DEVICE_OWNER,
        )
        neutron.network.delete_port(port)
        return (port.binding_vif_type == "veth") == want

    await eventually(probe, f"ml2 {'binding' if want else 'declining'} host {host}")


async def serves_only_flat(etcd: EtcdClient, node: Node) -> None:
    caps = {"v": 1, "vif_types": ["veth"], "network_types": ["flat"]}
    await etcd.put(keys.state_capabilities(node.name), json.dumps(caps).encode())


def calls(running: Any, op: str) -> float:
    registry = running.service.metrics.registry
    return float(registry.get_sample_value("podwire_neutron_calls_total", {"op": op}) or 0)


async def test_populate_refuses_node_without_live_agent(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    live, dead = await nodes.add(), await nodes.add()
    await nodes.kill(dead)
    running = await controllers(settings_for(stack, [live, dead], min=0))
    body = {"nodes": [live.name, dead.name], "network": network.id, "count": 1}
    status, answer = await admin(http, "POST", f"{running.url}/v1/pools/populate", body)
    assert status == 409
    assert answer["error"].startswith(f"node {dead.name} has no live agent")
    assert host_ports(neutron, network, dead.name) == []
    assert host_ports(neutron, network, live.name) == []  # refused as a whole
    status, answer = await admin(
        http, "POST", f"{running.url}/v1/pools/populate", {**body, "nodes": [live.name]}
    )
    assert (status, answer) == (200, {"created": {live.name: 1}})


async def test_failed_bindings_are_retried_then_deleted_never_pooled(
    stack: dict[str, Any],
    etcd: EtcdClient,
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    await serves_only_flat(etcd, node)  # the network is VXLAN: ml2 declines this host
    await ml2_binds(neutron, network, node.name, want=False)
    running = await controllers(settings_for(stack, [node], min=0, binding_retries=1))
    body = {"nodes": [node.name], "network": network.id, "count": 3}
    status, answer = await admin(http, "POST", f"{running.url}/v1/pools/populate", body)
    # Not "created: 0" with no reason: what did not bind, where, and what to check.
    assert status == 409, answer
    assert answer["cause"] == "binding_failed" and answer["retryable"] is False, answer
    for named in (node.name, network.id, "binding_failed", "vxlan", "capabilities"):
        assert named in answer["error"], answer
    assert calls(running, "update_port") == 3
    assert host_ports(neutron, network, node.name) == []  # deleted, not leaked
    key = PoolKey(node.name, network.project_id, network.id)
    assert pooled_ports(running, key) == set()
    status, answer = await request_vif(http, running.url, node, vif_body("b1.eth0", network))
    # A pod's request is retried: the node's agent may come to serve the network any time.
    assert status == 503 and answer["retryable"] is True, answer
    assert "bound none of the 3 ports" in answer["error"], answer  # a batch
    assert host_ports(neutron, network, node.name) == []


async def test_populate_refuses_a_node_that_keeps_no_pool(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    pooled, unpooled = await nodes.add(), await nodes.add(pod_driver="unpooled")
    running = await controllers(settings_for(stack, [pooled, unpooled], min=0))
    body = {"nodes": [pooled.name, unpooled.name], "network": network.id, "count": 1}
    status, answer = await admin(http, "POST", f"{running.url}/v1/pools/populate", body)
    assert status == 409 and answer["cause"] == "not_pooled", answer
    assert unpooled.name in answer["error"] and "unpooled" in answer["error"], answer
    assert host_ports(neutron, network, pooled.name) == []  # refused as a whole


async def test_rebind_succeeds_once_the_agent_registers(
    stack: dict[str, Any],
    etcd: EtcdClient,
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
) -> None:
    node = await nodes.add()
    await nodes.kill(node)
    await ml2_binds(neutron, network, node.name, want=False)
    running = await controllers(settings_for(stack, [node], min=0))
    failed = neutron.network.create_port(
        network_id=network.id,
        project_id=network.project_id,
        binding_host_id=node.name,
        device_owner=DEVICE_OWNER,
    )
    assert failed.binding_vif_type == "binding_failed"
    lease = await etcd.grant_lease(120)
    nodes.leases[node.name] = lease
    alive = b'{"v":1,"started_at":1,"version":"test"}'
    await etcd.put(keys.state_alive(node.name), alive, lease=lease.id)
    await ml2_binds(neutron, network, node.name, want=True)
    bound = await settle_bindings(running.service.neutron, node.name, [failed], retries=1)
    assert [(str(p.id), p.binding_vif_type) for p in bound] == [(failed.id, "veth")]


async def test_refill_skips_node_without_live_agent(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=2, batch=2))
    await nodes.kill(node)
    before = calls(running, "create_ports")
    for index in range(3):
        att = f"d{index}.eth0"
        status, answer = await request_vif(http, running.url, node, vif_body(att, network))
        assert status == 503, answer
        assert "has no live agent" in answer["error"]
    await running.service.drain()
    assert calls(running, "create_ports") == before
    assert running.service.liveness.noted_dead(node.name)
    skipped = [r for r in caplog.records if r.getMessage() == "pool.refill_skipped"]
    assert len(skipped) == 1  # logged once, not per skipped refill
    assert host_ports(neutron, network, node.name) == []


async def test_recovery_deletes_ports_whose_binding_failed(
    stack: dict[str, Any], neutron: Any, network: Any, nodes: ScriptedNodes
) -> None:
    """Recovery from a Neutron listing: a port of ours whose binding failed is deleted, never
    pooled, while a bound one is pooled."""
    live, dead = await nodes.add(), await nodes.add()
    await nodes.kill(dead)
    await ml2_binds(neutron, network, live.name, want=True)
    await ml2_binds(neutron, network, dead.name, want=False)
    ports = {}
    for node in (live, dead):
        ports[node.name] = neutron.network.create_port(
            network_id=network.id,
            project_id=network.project_id,
            binding_host_id=node.name,
            device_owner=DEVICE_OWNER,
        )
    assert ports[dead.name].binding_vif_type == "binding_failed"
    settings = settings_for(stack, [live, dead])
    controller = Controller(settings, nodes.etcd, connect(settings.neutron))
    controller.term.begin(1)  # recovery runs in a leader term (its deletes check it)
    await recover(
        controller.service, controller.neutron, None
    )  # no etcd: always the Neutron listing
    assert neutron.network.find_port(ports[dead.name].id) is None
    key = PoolKey(live.name, network.project_id, network.id)
    pooled = {p for _, group in controller.service.pools.groups(key) for p in group}
    assert ports[live.name].id in pooled
    assert all(k.node != dead.name for k in controller.service.pools.pool_keys())
