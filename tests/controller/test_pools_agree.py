"""Pools agree with Neutron: pooled ports deleted, unbound or re-addressed through Neutron's API
leave their pool or are handed out as they are now, without the controller asking Neutron."""

from __future__ import annotations

from typing import Any

import aiohttp

from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ScriptedNodes,
    admin,
    pooled_ports,
    request_vif,
    settings_for,
    vif_body,
)
from tests.neutron_calls import neutron_call_count
from tests.scripted_agent import eventually


async def _populated(
    running: Any, http: aiohttp.ClientSession, node: Any, network: Any, count: int
) -> set[str]:
    body = {"nodes": [node.name], "network": network.id, "count": count}
    status, answer = await admin(http, "POST", running.url + "/v1/pools/populate", body)
    assert status == 200, answer
    key = PoolKey(node.name, network.project_id, network.id)
    await eventually(
        lambda: _all_seen(running, key, count), f"{count} pooled ports in the mirror", timeout=30
    )
    return pooled_ports(running, key)


async def _all_seen(running: Any, key: PoolKey, count: int) -> bool:
    pools = running.service.pools
    return not pools.unseen(key) and pools.size(key) == count


async def test_ports_deleted_unbound_or_readdressed_in_neutron(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=0))
    key = PoolKey(node.name, network.project_id, network.id)
    ports = sorted(await _populated(running, http, node, network, 5))
    deleted, unbound, readdressed, kept = ports[:2], ports[2], ports[3], ports[4]
    for port_id in deleted:
        neutron.network.delete_port(port_id)
    neutron.network.update_port(unbound, binding_host_id="")
    subnet = next(iter(neutron.network.subnets(network_id=network.id)))
    new_ip = "10.77.3.200"
    neutron.network.update_port(
        readdressed, fixed_ips=[{"subnet_id": subnet.id, "ip_address": new_ip}]
    )
    calls = neutron_call_count(running.controller.metrics)

    async def agreed() -> bool:
        vif = running.service.pools.vif(readdressed)
        current = vif is not None and [ip.ip_address for ip in vif.fixed_ips] == [new_ip]
        return pooled_ports(running, key) == {readdressed, kept} and current

    await eventually(agreed, "the pool as Neutron has it", timeout=10)
    assert neutron_call_count(running.controller.metrics) == calls  # no Neutron call for it

    handed: dict[str, Any] = {}
    for name in ("a:eth0", "b:eth0"):
        status, body = await request_vif(http, running.url, node, vif_body(name, network))
        assert status == 200, body
        handed[body["vif"]["port_id"]] = body["vif"]
    assert set(handed) == {readdressed, kept}
    assert [ip["ip_address"] for ip in handed[readdressed]["fixed_ips"]] == [new_ip]
