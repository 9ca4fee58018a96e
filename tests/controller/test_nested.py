"""Nested mode: subports on the node's trunk, VLAN ids per trunk, recovery, free."""

from __future__ import annotations

from typing import Any

import aiohttp

from podwire.controller.pools import PoolKey
from tests.controller.conftest import (
    ScriptedNodes,
    admin,
    request_vif,
    settings_for,
    vif_body,
)
from tests.scripted_agent import eventually


async def test_nested_pool_lifecycle(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add(pod_driver="nested")
    parent = neutron.network.create_port(network_id=network.id, project_id=network.project_id)
    trunk = neutron.network.create_trunk(
        port_id=parent.id, name=node.name, project_id=network.project_id
    )
    neutron.network.update_port(parent.id, binding_host_id=node.name)
    try:
        await _scenario(stack, neutron, network, node, trunk, controllers, http)
    finally:
        for sub in neutron.network.get_trunk_subports(trunk.id)["sub_ports"]:
            neutron.network.delete_trunk_subports(trunk.id, [{"port_id": sub["port_id"]}])
        neutron.network.update_port(parent.id, binding_host_id="")
        neutron.network.delete_trunk(trunk.id)


async def _scenario(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    node: Any,
    trunk: Any,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    settings = settings_for(stack, [node], min=0, batch=2)
    first = await controllers(settings)
    status, body = await admin(
        http,
        "POST",
        first.url + "/v1/pools/populate",
        {"nodes": [node.name], "network": network.id, "count": 2},
    )
    assert status == 200, body
    subports = neutron.network.get_trunk_subports(trunk.id)["sub_ports"]
    assert sorted(s["segmentation_id"] for s in subports) == [1, 2]
    status, got = await request_vif(http, first.url, node, vif_body("n:eth0", network))
    assert status == 200 and got["vif"]["vlan_id"] in (1, 2)
    await first.stop()
    second = await controllers(settings)
    key = PoolKey(node.name, network.project_id, network.id)
    assert second.service.pools.size(key) == 1
    assert second.controller.nested.vlans.in_use(trunk.id) == {1, 2}
    # No trunk driver bound them here (the parent is not podwire's): unbound subports of a
    # trunk are not leftovers, neither to recovery nor to its check against Neutron.
    report = second.controller.recovery
    if report.source == "etcd":  # else recovery listed Neutron (and deleted) before serving

        async def verified() -> bool:
            return report.verified

        await eventually(verified, "recovery verified")
    assert len(neutron.network.get_trunk_subports(trunk.id)["sub_ports"]) == 2
    assert second.service.pools.size(key) == 1
    status, body = await admin(http, "POST", second.url + "/v1/pools/free", {"nodes": [node.name]})
    assert status == 200 and body == {"freed": 1}
    remaining = neutron.network.get_trunk_subports(trunk.id)["sub_ports"]
    assert [s["port_id"] for s in remaining] == [got["vif"]["port_id"]]
    assert second.controller.nested.vlans.in_use(trunk.id) == {got["vif"]["vlan_id"]}
