"""One owner per port: duplicate in-use records never put a live pod's port back in a pool,
records whose ids disagree are refused, and a request and a release of one attachment are
served in arrival order (the real controller, etcd and Neutron)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.controller.recycler import recycle_once
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
from tests.scripted_agent import eventually


async def new_term(running: Any) -> None:
    """End the leader's term as a lost lease does; it campaigns, wins and recovers again."""
    controller = running.controller
    terms = controller.leadership.terms
    lease = controller.leadership.lease
    assert lease is not None
    await lease.revoke()

    async def recovered() -> bool:
        return controller.leadership.terms > terms and controller.service.serving

    await eventually(recovered, "a new term, recovered", timeout=60)


async def test_a_released_duplicate_leaves_the_port_with_the_other_record(
    stack: dict[str, Any],
    etcd: EtcdClient,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=0))
    status, body = await request_vif(http, running.url, node, vif_body("live:eth0", network))
    assert status == 200, body
    port = body["vif"]["port_id"]
    record = await etcd.get(keys.vif(node.name, "live:eth0"))
    assert record is not None
    await etcd.put(keys.vif(node.name, "restored:eth0"), record.value)  # a restore's copy
    edited = json.loads(record.value)
    edited["port_id"] = str(uuid.uuid4())  # the record's copies of the port id disagree
    await etcd.put(keys.vif(node.name, "edited:eth0"), json.dumps(edited).encode())
    await new_term(running)

    service = running.service
    assert set(service.term.attachments.vifs_of_node(node.name)) == {"live:eth0", "restored:eth0"}
    assert service.term.attachments.disputed_on(node.name) == {port: ["live:eth0", "restored:eth0"]}
    async with http.get(
        f"{running.url}/v1/nodes/{node.name}/vifs",
        headers={"Authorization": f"Bearer {node.token}"},
    ) as response:
        listed = await response.json()
    assert listed["disputed"] == {port: ["live:eth0", "restored:eth0"]}

    assert await release_vif(http, running.url, node, "restored:eth0") == 204
    await recycle_once(service, running.controller.neutron, running.controller.settings.pool)
    key = PoolKey(node.name, network.project_id, network.id)
    assert port not in pooled_ports(running, key)
    assert service.term.attachments.vifs_of_node(node.name)["live:eth0"].port_id == port
    assert service.term.attachments.disputed_on(node.name) == {}
    status, other = await request_vif(http, running.url, node, vif_body("next:eth0", network))
    assert status == 200 and other["vif"]["port_id"] != port


@pytest.mark.slow
async def test_a_release_racing_its_request_is_served_in_arrival_order(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    """POST and DELETE of one attachment at once, 100 times. Served one at a time in arrival
    order: a DELETE that arrives while the POST is served waits for it and releases what it
    got (204 after the 200, nothing held); in any order, the attachment is held at the end
    exactly when the POST was answered last."""
    node = await nodes.add()
    # Released ports are not recycled here, so every POST waits for a port Neutron creates:
    # a DELETE sent 10-40 ms after it arrives while it is being served.
    running = await controllers(settings_for(stack, [node], min=0, batch=1))
    service = running.service

    async def timed(call: Any) -> tuple[int, float]:
        answer = await call
        status = answer[0] if isinstance(answer, tuple) else answer
        return status, time.monotonic()

    async def later(call: Any, delay: float) -> Any:
        await asyncio.sleep(delay)
        return await call

    for attempt in range(100):
        name = f"race{attempt}:eth0"
        post = timed(request_vif(http, running.url, node, vif_body(name, network)))
        if attempt < 50:  # the DELETE arrives while the POST is served
            delete = timed(later(release_vif(http, running.url, node, name), 0.01 + attempt / 2000))
            (post_status, posted), (delete_status, deleted) = await asyncio.gather(post, delete)
            assert deleted > posted, f"try {attempt}: the DELETE did not wait for the POST"
        else:  # sent together, DELETE first: either may arrive first
            delete = timed(release_vif(http, running.url, node, name))
            (delete_status, deleted), (post_status, posted) = await asyncio.gather(delete, post)
        assert (post_status, delete_status) == (200, 204)
        held = name in service.term.attachments.vifs_of_node(node.name)
        assert held == (posted > deleted), f"try {attempt}: held={held}"
        if held:
            assert await release_vif(http, running.url, node, name) == 204
