"""VIF API against the real stack: pool hits, refill, in-use records, tokens, bad input."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.controller.recycler import recycle_once
from podwire.etcd.client import EtcdClient
from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ADMIN,
    ScriptedNodes,
    admin,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)
from tests.neutron_calls import neutron_call_count


async def test_request_refill_hot_path_release_recycle(
    stack: dict[str, Any],
    etcd: EtcdClient,
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=1))
    status, first = await request_vif(http, running.url, node, vif_body("c1:eth0", network))
    assert status == 200, first
    port = neutron.network.get_port(first["vif"]["port_id"])
    assert port.binding_host_id == node.name and port.device_owner == "compute:podwire"
    record = await etcd.get(keys.vif(node.name, "c1:eth0"))
    assert record is not None and json.loads(record.value)["port_id"] == port.id
    # idempotent: the same attachment gets the same VIF again
    status, again = await request_vif(http, running.url, node, vif_body("c1:eth0", network))
    assert again["vif"] == first["vif"]
    await running.service.drain()
    key = PoolKey(node.name, network.project_id, network.id)
    assert running.service.pools.size(key) >= 2
    calls = neutron_call_count(running.controller.metrics)
    status, second = await request_vif(http, running.url, node, vif_body("c2:eth0", network))
    assert status == 200 and second["vif"]["port_id"] != port.id
    assert neutron_call_count(running.controller.metrics) == calls  # hot path: no Neutron
    assert await release_vif(http, running.url, node, "c1:eth0") == 204
    assert await release_vif(http, running.url, node, "c1:eth0") == 204
    assert await etcd.get(keys.vif(node.name, "c1:eth0")) is None
    assert running.service.pools.recyclable() == {port.id: key}
    before = running.service.pools.size(key)
    assert await recycle_once(
        running.service, running.controller.neutron, running.controller.settings.pool
    ) == (1, 0)
    assert running.service.pools.size(key) == before + 1
    async with http.get(running.url + "/metrics") as response:
        text = await response.text()
    assert "podwire_pool_hits_total" in text and "podwire_neutron_calls_total" in text


@pytest.mark.slow
async def test_hundred_concurrent_requests_get_distinct_ports(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=1, batch=10))
    results = await asyncio.gather(
        *(request_vif(http, running.url, node, vif_body(f"p{i}:eth0", network)) for i in range(100))
    )
    assert all(status == 200 for status, _ in results), [b for s, b in results if s != 200][:3]
    port_ids = [body["vif"]["port_id"] for _, body in results]
    assert len(set(port_ids)) == 100
    assert len(running.service.attachments) == 100


async def test_tokens_and_bad_input_change_nothing(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
    sgs: list[str],
) -> None:
    node, other = await nodes.add(), await nodes.add()
    running = await controllers(settings_for(stack, [node, other], min=0))
    url = f"{running.url}/v1/nodes/{node.name}/vifs"
    body = vif_body("x:eth0", network)
    async with http.post(url, json=body) as response:
        assert response.status == 401
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {other.token}"}) as r:
        assert r.status == 403 and other.name in (await r.json())["error"]
    auth = {"Authorization": f"Bearer {node.token}"}
    cases = [
        (b"not json", 400, "JSON"),
        (json.dumps({"attachment": "../x", "network": network.id}).encode(), 400, "attachment"),
        (json.dumps({"attachment": "a.b", "network": network.id, "junk": 1}).encode(), 400, "junk"),
        (json.dumps({"attachment": "a.b", "network": "no-such-net"}).encode(), 404, "network"),
        (
            json.dumps(
                {**body, "security_groups": ["0" * 8 + "-0000-0000-0000-" + "0" * 12]}
            ).encode(),
            404,
            "security groups",
        ),
        # another project than the network's: it may not use it (a tenant check, not "unknown")
        (json.dumps({**body, "project_id": "ab" * 16}).encode(), 403, "project"),
        # Regressions: a trailing newline passed "$"-anchored patterns; deep nesting was a 500.
        (json.dumps({**body, "attachment": "c:eth0\n"}).encode(), 400, "attachment"),
        (json.dumps({**body, "network": network.id + "\n"}).encode(), 400, "network"),
        (b'{"attachment": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", 400, "nested"),
        (json.dumps({**body, "pod": {"name": "p", "extra": 1}}).encode(), 400, "extra"),
    ]
    for raw, status, word in cases:
        async with http.post(url, data=raw, headers=auth) as response:
            assert response.status == status, (raw, await response.text())
            assert word in (await response.json())["error"]
    populate = {"nodes": [node.name], "network": network.id, "count": 100000}
    assert (await admin(http, "POST", running.url + "/v1/pools/populate", populate))[0] == 400
    async with http.get(running.url + "/v1/pools", headers={"Authorization": "Bearer x"}) as r:
        assert r.status == 401
    status, listing = await admin(http, "GET", running.url + "/v1/pools")
    assert status == 200 and listing == {"pools": []}
    assert running.service.attachments == {}
    assert ADMIN  # the admin token is only accepted on admin routes:
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {ADMIN}"}) as r:
        assert r.status == 401
