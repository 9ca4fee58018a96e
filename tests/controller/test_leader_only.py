"""Only the serving leader acts: a standby refuses every VIF and admin call (503 naming the
leader, ``Retry-After``) without a Neutron write; a leader that loses its term drops its pools
at once, and work decided in that term cannot write to Neutron afterwards."""

from __future__ import annotations

import contextvars
from typing import Any

import aiohttp
import pytest

from podwire.controller.leader import ELECTION
from podwire.controller.term import TermGuard
from podwire.errors import NotLeader
from podwire.etcd.client import EtcdClient
from podwire.schema.inuse import PoolKey
from podwire.schema.records import leader_value
from tests.controller.conftest import (
    ADMIN,
    ScriptedNodes,
    admin,
    eventually,
    pooled_ports,
    settings_for,
    vif_body,
)
from tests.neutron_calls import neutron_call_count

pytestmark = pytest.mark.stack


async def _refusals(http: aiohttp.ClientSession, base: str, node: Any, network: Any) -> list[Any]:
    pool = f"/v1/pools/{node.name}/{network.project_id}/{network.id}"
    node_auth = {"Authorization": f"Bearer {node.token}"}
    admin_auth = {"Authorization": f"Bearer {ADMIN}"}
    calls = [
        ("POST", f"/v1/nodes/{node.name}/vifs", node_auth, vif_body("x:eth0", network)),
        ("GET", f"/v1/nodes/{node.name}/vifs", node_auth, None),
        ("DELETE", f"/v1/nodes/{node.name}/vifs/x:eth0", node_auth, None),
        ("GET", "/v1/pools", admin_auth, None),
        ("GET", pool, admin_auth, None),
        ("POST", "/v1/pools/populate", admin_auth,
         {"nodes": [node.name], "network": network.id, "count": 1}),
        ("POST", "/v1/pools/free", admin_auth, {"nodes": [node.name]}),
        ("DELETE", f"/v1/networks/{network.id}/pools", admin_auth, None),
        ("DELETE", f"/v1/security-groups/{network.id}/pools", admin_auth, None),
    ]  # fmt: skip
    answers = []
    for method, path, headers, body in calls:
        async with http.request(method, base + path, json=body, headers=headers) as response:
            payload = await response.json(content_type=None)
            answers.append((f"{method} {path}", response.status, response.headers, payload))
    return answers


async def test_a_standby_refuses_every_call_and_names_the_leader(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    settings = settings_for(stack, [node], min=0)
    leader = await controllers(settings)
    standby = await controllers(settings, wait_ready=False)
    writes_before = neutron_call_count(standby.controller.metrics)
    for call, status, headers, body in await _refusals(http, standby.url, node, network):
        assert status == 503, (call, body)
        assert body["cause"] == "not_serving" and body["retryable"] is True, (call, body)
        assert body["leader"] == leader.url, (call, body)
        assert f"the leader serves at {leader.url}" in body["error"], (call, body)
        assert "Retry-After" in headers, call
    assert neutron_call_count(standby.controller.metrics) == writes_before  # not one Neutron call
    # Tokens are checked first: a stranger learns nothing, not even where the leader is.
    async with http.get(standby.url + "/v1/pools") as response:
        assert response.status == 401
        assert "leader" not in await response.json(content_type=None)


async def test_a_lost_term_drops_the_pools_and_refuses_writes(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
    etcd: EtcdClient,
) -> None:
    node = await nodes.add()
    settings = settings_for(stack, [node], min=0)
    running = await controllers(settings, ttl=2)
    ctl = running.controller
    status, body = await admin(
        http, "POST", running.url + "/v1/pools/populate",
        {"nodes": [node.name], "network": network.id, "count": 2},
    )  # fmt: skip
    assert status == 200, body
    key = PoolKey(node.name, network.project_id, network.id)
    port = next(iter(pooled_ports(running, key)))
    lease = ctl.leadership.lease
    assert lease is not None
    # The term is lost (as when etcd expired the lease) and someone else leads now.
    await lease.revoke()
    other = await etcd.grant_lease(30)
    try:
        await etcd.create_if_absent(ELECTION, leader_value("other", "http://other:7070"), other.id)

        async def ended() -> bool:
            return not running.service.serving and ctl.term.held is None

        await eventually(ended, "the term ended")
        assert running.service.pools.size(key) == 0  # dropped: the other may hand them out
        calls = neutron_call_count(ctl.metrics)
        with pytest.raises(NotLeader, match="holds no leader term"):
            await ctl.neutron.delete_port(port)
        assert neutron_call_count(ctl.metrics) == calls  # refused before Neutron was asked
        status, body = await admin(http, "POST", running.url + "/v1/pools/free",
                                   {"nodes": [node.name]})  # fmt: skip
        assert (status, body["leader"]) == (503, "http://other:7070"), body
    finally:
        await other.revoke()


def test_work_decided_in_an_ended_term_is_refused() -> None:
    """Each term runs in a task of its own; work started in it carries that term along."""
    guard = TermGuard()
    with pytest.raises(NotLeader, match="holds no leader term"):
        guard.check("Neutron create_ports")
    first_term = contextvars.Context()
    first_term.run(guard.begin, 1)
    work = first_term.run(contextvars.copy_context)  # e.g. a refill the term started
    work.run(guard.check, "Neutron create_ports")  # decided in the term held
    guard.end()
    with pytest.raises(NotLeader, match="holds no leader term"):
        work.run(guard.check, "Neutron create_ports")
    contextvars.Context().run(guard.begin, 2)
    with pytest.raises(NotLeader, match="decided in leader term 1, and the term held now is 2"):
        work.run(guard.check, "Neutron create_ports")
    request = contextvars.Context()  # an HTTP request accepted now joins the term held
    request.run(guard.join)
    request.run(guard.check, "Neutron create_ports")
