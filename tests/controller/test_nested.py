"""Nested mode: subports on the node's trunk, VLAN ids per trunk, recovery, free; a trunk of
another project than the pool's never gets a subport (by name, by configured id, at recovery)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire.config import load_settings
from podwire.errors import ConfigError
from podwire.schema.inuse import PoolKey
from podwire.schema.vif import DEVICE_OWNER
from tests.controller.conftest import (
    ScriptedNodes,
    admin,
    make_network,
    pooled_ports,
    request_vif,
    settings_for,
    vif_body,
)
from tests.scripted_agent import eventually


@dataclass
class Trunks:
    """Trunks of this test's own, each on a parent port of its network's project."""

    neutron: Any
    made: list[tuple[Any, Any]] = field(default_factory=list)  # (trunk, parent port)

    def add(self, network: Any, name: str) -> Any:
        net = self.neutron.network
        parent = net.create_port(network_id=network.id, project_id=network.project_id)
        trunk = net.create_trunk(port_id=parent.id, name=name, project_id=network.project_id)
        self.made.append((trunk, parent))
        return trunk

    def subports(self, trunk: Any) -> list[str]:
        """The trunk's subports' port ids."""
        listed = self.neutron.network.get_trunk_subports(trunk.id)["sub_ports"]
        return sorted(str(s["port_id"]) for s in listed)

    def remove(self) -> None:
        net = self.neutron.network
        for trunk, parent in self.made:
            ports = self.subports(trunk)
            if ports:
                net.delete_trunk_subports(trunk.id, [{"port_id": p} for p in ports])
            net.delete_trunk(trunk.id)
            net.delete_port(parent.id)


@pytest.fixture
def trunks(neutron: Any, project_id: str, other_project: str) -> Iterator[Trunks]:
    """Removed before the test's projects are (a trunk holds its parent and subports)."""
    made = Trunks(neutron)
    yield made
    made.remove()


def ours(neutron: Any, network: Any) -> list[str]:
    """podwire's ports on the network."""
    return [p.id for p in neutron.network.ports(network_id=network.id, device_owner=DEVICE_OWNER)]


def populate_body(node: Any, network: Any, count: int = 2) -> dict[str, Any]:
    return {"nodes": [node.name], "network": network.id, "count": count}


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


async def test_a_trunk_of_another_project_gets_no_subports(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    other_project: str,
    trunks: Trunks,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    """Tenant X names a trunk after a nested node: project P's ports never go on it, whether
    the node's trunk is looked up by name or X's trunk is configured as the node's."""
    node = await nodes.add(pod_driver="nested")
    tenant = make_network(neutron, other_project, "pw-tenant", "10.85.0.0/24")
    foreign = trunks.add(tenant, node.name)
    running = await controllers(settings_for(stack, [node], min=0, batch=2))
    pools = running.url + "/v1/pools/populate"
    status, answer = await admin(http, "POST", pools, populate_body(node, network))
    assert status == 404 and answer["cause"] == "unknown_trunk", answer
    assert node.name in answer["error"] and network.project_id in answer["error"], answer
    status, answer = await request_vif(http, running.url, node, vif_body("x:eth0", network))
    assert status == 404 and answer["cause"] == "unknown_trunk", answer
    assert trunks.subports(foreign) == [] and ours(neutron, network) == []
    await running.stop()

    mapped = {node.name: foreign.id}
    running = await controllers(settings_for(stack, [node], min=0, nested_trunks=mapped))
    status, answer = await request_vif(http, running.url, node, vif_body("y:eth0", network))
    assert status == 403 and answer["cause"] == "trunk_not_allowed", answer
    for named in (node.name, foreign.id, network.project_id, other_project):
        assert named in answer["error"], answer
    pools = running.url + "/v1/pools/populate"
    status, answer = await admin(http, "POST", pools, populate_body(node, network))
    assert status == 403 and answer["cause"] == "trunk_not_allowed", answer
    assert trunks.subports(foreign) == [] and ours(neutron, network) == []


async def test_the_configured_trunk_is_used_not_the_one_named_after_the_node(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    trunks: Trunks,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add(pod_driver="nested")
    named = trunks.add(network, node.name)
    chosen = trunks.add(network, f"vm-{uuid.uuid4().hex[:8]}")
    settings = settings_for(stack, [node], min=0, batch=2, nested_trunks={node.name: chosen.id})
    running = await controllers(settings)
    status, answer = await admin(http, "POST", running.url + "/v1/pools/populate",
                                 populate_body(node, network))  # fmt: skip
    assert (status, answer) == (200, {"created": {node.name: 2}})
    status, got = await request_vif(http, running.url, node, vif_body("c:eth0", network))
    assert status == 200 and got["vif"]["port_id"] in trunks.subports(chosen), got
    assert len(trunks.subports(chosen)) == 2 and trunks.subports(named) == []
    await running.stop()
    again = await controllers(settings)  # recovery finds the node's subports by the trunk's id
    key = PoolKey(node.name, network.project_id, network.id)
    assert again.service.pools.size(key) == 1
    assert again.controller.nested.vlans.in_use(chosen.id) == {1, 2}


async def test_two_trunks_named_after_the_node_are_refused_as_ambiguous(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    trunks: Trunks,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add(pod_driver="nested")
    twins = [trunks.add(network, node.name) for _ in range(2)]
    running = await controllers(settings_for(stack, [node], min=0))
    status, answer = await admin(http, "POST", running.url + "/v1/pools/populate",
                                 populate_body(node, network))  # fmt: skip
    assert status == 409 and answer["cause"] == "trunk_ambiguous", answer
    assert all(t.id in answer["error"] for t in twins) and "pool.nested_trunks" in answer["error"]
    assert [trunks.subports(t) for t in twins] == [[], []] and ours(neutron, network) == []


async def test_recovery_takes_a_free_port_off_another_projects_trunk(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    other_project: str,
    trunks: Trunks,
    nodes: ScriptedNodes,
    controllers: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What an earlier podwire left (it looked trunks up by name in every project): a free
    pool port of P on X's trunk named after the node leaves that trunk and is deleted; the
    node's own trunk in P keeps its subport, pooled."""
    node = await nodes.add(pod_driver="nested")
    foreign = trunks.add(make_network(neutron, other_project, "pw-tenant", "10.86.0.0/24"),
                         node.name)  # fmt: skip
    own = trunks.add(network, node.name)
    stray, kept = (
        neutron.network.create_port(
            network_id=network.id, project_id=network.project_id, device_owner=DEVICE_OWNER
        )
        for _ in range(2)
    )
    for trunk, port, vlan in ((foreign, stray, 7), (own, kept, 5)):
        subport = {"port_id": port.id, "segmentation_type": "vlan", "segmentation_id": vlan}
        neutron.network.add_trunk_subports(trunk.id, [subport])
    running = await controllers(settings_for(stack, [node], min=0))
    key = PoolKey(node.name, network.project_id, network.id)
    assert pooled_ports(running, key) == {kept.id}
    assert trunks.subports(foreign) == [] and trunks.subports(own) == [kept.id]
    assert neutron.network.find_port(stray.id) is None
    removed = [
        r for r in caplog.records if r.getMessage() == "controller.recovery.stray_subports_removed"
    ]
    assert len(removed) == 1


def test_nested_trunks_are_checked_at_start(tmp_path: Path) -> None:
    trunk = str(uuid.uuid4())
    path = tmp_path / "podwire.toml"
    path.write_text(f'[pool]\nnested_trunks = {{ node-1 = "{trunk}" }}\n')
    assert load_settings(path, env={}).pool.nested_trunks == {"node-1": trunk}
    env = {"PODWIRE_POOL_NESTED_TRUNKS": f"node-2={trunk}"}
    assert load_settings(path, env=env).pool.nested_trunks == {"node-2": trunk}
    for table, named in (
        ('{ node-1 = "not-a-trunk-id" }', "pool.nested_trunks.node-1"),
        (f'{{ "a/b" = "{trunk}" }}', "pool.nested_trunks"),
        (f'{{ node-1 = "{trunk}", node-2 = "{trunk}" }}', "given to both"),
        ('"node-1"', "expected a table"),
        ("{ node-1 = 1 }", "expected a table of str"),
    ):
        path.write_text(f"[pool]\nnested_trunks = {table}\n")
        with pytest.raises(ConfigError, match=named):
            load_settings(path, env={})
