"""What the VIF API refuses, and how: tenant checks (a request's network and groups must be
its project's, or shared) and the causes no retry fixes, each a JSON answer that says it is
permanent, names its cause and the network or group (the real controller and Neutron)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.controller.conftest import ScriptedNodes, request_vif, settings_for, vif_body


@pytest.fixture
def other_project(neutron: Any) -> Iterator[str]:
    """A second project of this test's own (its networks and groups go afterwards)."""
    project = uuid.uuid4().hex
    yield project
    for network in list(neutron.network.networks(project_id=project)):
        for port in list(neutron.network.ports(network_id=network.id)):  # also other projects'
            neutron.network.delete_port(port)
        neutron.network.delete_network(network)
    for sg in list(neutron.network.security_groups(project_id=project)):
        neutron.network.delete_security_group(sg)


def _network(neutron: Any, project: str, name: str, cidr: str | None, **extra: Any) -> Any:
    net = neutron.network.create_network(project_id=project, name=name, **extra)
    if cidr:
        neutron.network.create_subnet(
            project_id=project, network_id=net.id, cidr=cidr, ip_version=4
        )
    return net


def _refused(status: int, body: dict[str, Any], code: int, cause: str, *named: str) -> None:
    assert status == code, body
    assert body["retryable"] is False and body["cause"] == cause, body
    for text in named:
        assert text in body["error"], body


async def test_a_request_uses_only_its_projects_networks_and_groups(
    stack: dict[str, Any],
    neutron: Any,
    project_id: str,
    other_project: str,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=0))
    foreign = _network(neutron, other_project, "pw-foreign", "10.78.0.0/24")
    shared = _network(neutron, other_project, "pw-shared", "10.79.0.0/24", shared=True)
    foreign_sg = neutron.network.create_security_group(project_id=other_project, name="theirs")
    own_sg = neutron.network.create_security_group(project_id=project_id, name="ours")

    def body(name: str, net: Any, sgs: list[str] | None = None) -> dict[str, Any]:
        return {**vif_body(name, net, sgs), "project_id": project_id}

    status, answer = await request_vif(http, running.url, node, body("a:eth0", foreign))
    _refused(status, answer, 403, "network_not_allowed", foreign.id, project_id)
    by_name = {**body("b:eth0", foreign), "network": "pw-foreign"}
    status, answer = await request_vif(http, running.url, node, by_name)
    _refused(status, answer, 404, "unknown_network", "pw-foreign")  # not one it may use
    status, answer = await request_vif(
        http, running.url, node, body("c:eth0", network, [own_sg.id, foreign_sg.id])
    )
    _refused(status, answer, 403, "security_group_not_allowed", foreign_sg.id)
    assert own_sg.id not in answer["error"]
    status, answer = await request_vif(http, running.url, node, body("d:eth0", shared, [own_sg.id]))
    assert status == 200, answer
    assert answer["vif"]["network_id"] == shared.id


async def test_networks_no_port_can_work_on_are_refused_at_once(
    stack: dict[str, Any],
    neutron: Any,
    project_id: str,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=0))
    twins = [_network(neutron, project_id, "pw-twin", f"10.80.{i}.0/24") for i in range(2)]
    bare = _network(neutron, project_id, "pw-bare", None)
    down = _network(neutron, project_id, "pw-down", "10.81.0.0/24", admin_state_up=False)
    flat = _network(
        neutron,
        project_id,
        "pw-flat9",
        "10.82.0.0/24",
        provider_network_type="flat",
        provider_physical_network=f"phys{uuid.uuid4().hex[:6]}",
    )

    async def ask(name: str, net: Any, ref: str | None = None) -> tuple[int, dict[str, Any]]:
        req = {**vif_body(name, net), "network": ref or net.id}
        return await request_vif(http, running.url, node, req)

    _refused(
        *await ask("t:eth0", twins[0], "pw-twin"), 409, "network_ambiguous", *(n.id for n in twins)
    )
    _refused(*await ask("b:eth0", bare), 409, "network_without_subnet", bare.id)
    _refused(*await ask("d:eth0", down), 409, "network_down", down.id)
    status, answer = await ask("f:eth0", flat)
    _refused(status, answer, 409, "physnet_not_served", flat.provider_physical_network, node.name)
    assert not list(neutron.network.ports(network_id=flat.id))  # refused before any was made


async def test_a_full_subnet_is_named_not_retried(
    stack: dict[str, Any],
    neutron: Any,
    project_id: str,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=0, batch=3))
    small = _network(neutron, project_id, "pw-small", "10.83.0.0/29")  # 5 addresses for ports
    taken = []
    for _ in range(10):
        try:
            taken.append(neutron.network.create_port(project_id=project_id, network_id=small.id))
        except Exception:  # Neutron: "No more IP addresses available", the subnet is full
            break
    neutron.network.delete_port(taken.pop())  # one address left: a batch of 3 still gets it
    status, answer = await request_vif(http, running.url, node, vif_body("one:eth0", small))
    assert status == 200, answer
    status, answer = await request_vif(http, running.url, node, vif_body("two:eth0", small))
    _refused(status, answer, 409, "subnet_full", small.id, "10.83.0.0/29", "free addresses")


async def test_a_body_over_the_limit_gets_the_json_error(
    stack: dict[str, Any], nodes: ScriptedNodes, controllers: Any, http: aiohttp.ClientSession
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=0))
    big = {"attachment": "x:eth0", "network": "n", "pad": "x" * (65 * 1024)}
    status, answer = await request_vif(http, running.url, node, big)
    _refused(status, answer, 413, "body_too_large", "65536 bytes")
    async with http.get(running.url + "/v1/nope") as response:
        assert response.status == 404
        assert (await response.json())["cause"] == "no_such_path"
