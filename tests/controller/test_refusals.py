"""What the VIF API refuses, and how: tenant checks (a request's network and groups must be
its project's, or shared) and the causes no retry fixes, each a JSON answer that says it is
permanent, names its cause and the network or group (the real controller and Neutron)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import aiohttp

from tests.controller.conftest import ScriptedNodes, request_vif, settings_for, vif_body


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


def _fill(neutron: Any, project: str, network: Any) -> list[Any]:
    """Ports of another owner on every free address of the network (Neutron refuses the
    next one: "No more IP addresses available")."""
    taken = []
    for _ in range(300):
        try:
            taken.append(neutron.network.create_port(project_id=project, network_id=network.id))
        except Exception:  # openstacksdk's ConflictException: the subnet is full
            return taken
    raise AssertionError("the network never filled up")


async def test_requests_queued_behind_a_full_subnet_are_refused_together(
    stack: dict[str, Any],
    neutron: Any,
    project_id: str,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    """The first refill that finds the subnet full refuses every request waiting for the
    pool at once; the waiting requests' own refills ask Neutron nothing more, nor does the
    pool afterwards."""
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=2, batch=3))
    small = _network(neutron, project_id, "pw-full", "10.84.0.0/29")
    _fill(neutron, project_id, small)
    before = _creates(running)
    started = time.monotonic()

    async def ask(index: int) -> tuple[int, dict[str, Any], float]:
        body = vif_body(f"q{index}:eth0", small)
        status, answer = await request_vif(http, running.url, node, body)
        return status, answer, time.monotonic() - started

    answers = await asyncio.gather(*(ask(i) for i in range(20)))
    for status, answer, _ in answers:
        _refused(status, answer, 409, "subnet_full", small.id, "10.84.0.0/29")
    times = sorted(at for _, _, at in answers)
    assert times[-1] - times[0] < 2.0, times  # together, not one refill after another
    asked = _creates(running) - before
    assert asked < 20, asked  # not a refill (or two calls) per queued request
    await asyncio.sleep(2.0)
    await running.service.drain()
    assert _creates(running) - before == asked  # the pool does not spin on a full subnet


def _creates(running: Any) -> float:
    registry = running.service.metrics.registry
    sample = registry.get_sample_value("podwire_neutron_calls_total", {"op": "create_ports"})
    return float(sample or 0)


async def test_a_token_with_non_ascii_characters_is_refused_with_401(
    stack: dict[str, Any], network: Any, nodes: ScriptedNodes, controllers: Any
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=0))
    token = "Bearer t\u00f6ken-\u20ac".encode()
    for path in (f"/v1/nodes/{node.name}/vifs", "/v1/pools/populate"):
        status, answer = await _raw_post(running.url, path, token)
        assert status == 401, answer
        assert answer["cause"] == "unauthorized" and answer["retryable"] is False, answer
        assert "non-ASCII" in answer["error"], answer
    assert running.service.attachments == {}


async def _raw_post(base: str, path: str, authorization: bytes) -> tuple[int, dict[str, Any]]:
    """A POST whose Authorization header is UTF-8 bytes, as a client may send it (aiohttp's
    client would refuse to)."""
    host, _, port = base.removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b"{}"
    writer.write(
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
        b"Authorization: " + authorization + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    )
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)
