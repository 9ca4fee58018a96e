"""A released port is back in its pool at once, its SGs read from the forwarder's mirror
(real stack: Neutron, the ml2 forwarder, etcd)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp

from podwire import keys
from podwire.controller.mirror import MirrorFacts
from podwire.etcd.client import EtcdClient
from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ScriptedNodes,
    pooled_ports,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)
from tests.etcd_tools import delete_prefix
from tests.neutron_calls import neutron_call_count
from tests.scripted_agent import eventually


async def test_a_release_recycles_at_once_with_the_sgs_neutron_has_now_and_no_neutron_call(
    stack: dict[str, Any],
    etcd: EtcdClient,
    neutron: Any,
    network: Any,
    sgs: list[str],
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=2, recycle_on_release=True))
    key = PoolKey(node.name, network.project_id, network.id)
    status, body = await request_vif(http, running.url, node, vif_body("r1:eth0", network))
    assert status == 200, body
    port_id = body["vif"]["port_id"]
    # Someone changes the port's groups while it is in use; the journal mirrors the change.
    neutron.network.update_port(port_id, security_group_ids=[sgs[1]])
    await eventually(lambda: _mirrored_sgs(running, key, port_id, [sgs[1]]), "mirrored SGs")
    await running.service.drain()
    calls = neutron_call_count(running.controller.metrics)
    assert await release_vif(http, running.url, node, "r1:eth0") == 204
    await eventually(lambda: _pooled(running, key, port_id), "released port back in the pool")
    assert ((sgs[1],), [port_id]) in running.service.pools.groups(key)
    assert neutron_call_count(running.controller.metrics) == calls
    # The next request for those groups gets it from memory, as any pool hit.
    status, again = await request_vif(
        http, running.url, node, vif_body("r2:eth0", network, [sgs[1]])
    )
    assert status == 200 and again["vif"]["port_id"] == port_id


async def test_without_prompt_recycling_a_released_port_waits_for_the_pass(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=1, recycle_on_release=False))
    key = PoolKey(node.name, network.project_id, network.id)
    status, body = await request_vif(http, running.url, node, vif_body("w1:eth0", network))
    assert status == 200, body
    assert await release_vif(http, running.url, node, "w1:eth0") == 204
    await asyncio.sleep(0.5)  # a prompt pass takes milliseconds
    assert running.service.pools.recyclable() == {body["vif"]["port_id"]: key}


async def _pooled(running: Any, key: PoolKey, port_id: str) -> bool:
    return port_id in pooled_ports(running, key)


async def _mirrored_sgs(running: Any, key: PoolKey, port_id: str, wanted: list[str]) -> bool:
    found = await running.controller.mirror.bound_sgs({port_id: key})
    return bool(found) and found.get(port_id) == wanted


async def test_a_mirror_value_that_does_not_parse_is_left_to_neutron(
    etcd: EtcdClient, nodes: ScriptedNodes
) -> None:
    """Another writer's garbage under a node's ports is logged and skipped, never raised."""
    node = await nodes.add()
    incomplete, garbage = str(uuid.uuid4()), str(uuid.uuid4())
    key = PoolKey(node.name, uuid.uuid4().hex, str(uuid.uuid4()))
    mirror = MirrorFacts(etcd)
    await eventually(lambda: _vouching(mirror, key), "the forwarder vouches for the mirror")
    await etcd.put(keys.node_port(node.name, incomplete), b'{"v": 1, "port_id": 7}')
    await etcd.put(keys.node_port(node.name, garbage), b"\xff not json")
    try:
        assert await mirror.bound_sgs({incomplete: key, garbage: key}) == {}
        assert mirror.vouched
    finally:
        await delete_prefix(etcd, keys.node_ports_prefix(node.name))


async def _vouching(mirror: MirrorFacts, key: PoolKey) -> bool:
    return await mirror.bound_sgs({"none": key}) is not None
