"""``pool.port_debug``: pool ports are named "available", in-use ones after their pod."""

from __future__ import annotations

from typing import Any

import aiohttp

from podwire.controller.drivers import AVAILABLE_NAME
from podwire.controller.recycler import recycle_once
from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ScriptedNodes,
    admin,
    pooled_ports,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)


def names(neutron: Any, project_id: str) -> dict[str, tuple[str, str]]:
    """Port id -> (name, device_id) of every port of the project."""
    return {str(p.id): (p.name, p.device_id) for p in neutron.network.ports(project_id=project_id)}


async def test_port_debug_names_pool_in_use_and_recycled_ports(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    before = names(neutron, network.project_id)
    settings = settings_for(stack, [node], min=0, batch=2, port_debug=True)
    running = await controllers(settings)
    key = PoolKey(node.name, network.project_id, network.id)
    status, body = await admin(
        http,
        "POST",
        running.url + "/v1/pools/populate",
        {"nodes": [node.name], "network": network.id, "count": 2},
    )
    assert status == 200 and body == {"created": {node.name: 2}}
    pooled = {p: v for p, v in names(neutron, network.project_id).items() if p not in before}
    assert len(pooled) == 2
    assert set(pooled.values()) == {(AVAILABLE_NAME, "")}

    # in use: named after the pod in the request, device_id its uid
    request = vif_body("c1:eth0", network)
    request["pod"]["name"] = "web-0"
    status, got = await request_vif(http, running.url, node, request)
    assert status == 200
    port_id = got["vif"]["port_id"]
    await running.service.drain()  # the naming runs after the VIF is returned
    now = names(neutron, network.project_id)
    assert now[port_id] == ("web-0", request["pod"]["uid"])
    (other,) = set(pooled) - {port_id}
    assert now[other] == (AVAILABLE_NAME, "")

    # released and recycled: the available name is back, and the port is in the pool again
    assert await release_vif(http, running.url, node, "c1:eth0") == 204
    assert await recycle_once(running.service, running.controller.neutron, settings.pool) == (1, 0)
    assert names(neutron, network.project_id)[port_id] == (AVAILABLE_NAME, "")
    assert pooled_ports(running, key) == set(pooled)

    status, freed = await admin(
        http, "POST", running.url + "/v1/pools/free", {"nodes": [node.name]}
    )
    assert status == 200 and freed == {"freed": 2}
    assert names(neutron, network.project_id) == before
