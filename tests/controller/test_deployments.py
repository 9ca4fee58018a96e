"""Two podwire deployments (two clusters: a controller and nodes each) on one Neutron and one
etcd, as several Kubernetes clusters share one OpenStack. Real controllers, etcd, Neutron and
its ml2 driver (the session's serves "podwire" and "tenant-b"); the nodes are scripted.

What must hold: each deployment's ports carry its tag and only its controller lists, pools,
recycles, sweeps or deletes them; its keys live in its own etcd namespace, where the ml2 driver
also writes the desired state of its hosts' ports; restarts in either change nothing for the
other. A port from before deployments existed (no tag) is adopted by the default deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.config import EtcdSettings
from podwire.controller import recovery
from podwire.controller.app import Controller
from podwire.controller.leader import ELECTION
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect
from podwire.schema import nodes as values
from podwire.schema.deployment import Deployment
from podwire.status.report import collect
from tests.conftest import SECOND_DEPLOYMENT
from tests.controller.conftest import (
    Node,
    Running,
    ScriptedNodes,
    make_network,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)
from tests.etcd_tools import delete_prefix
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack

DEFAULT = Deployment()
SECOND = Deployment(SECOND_DEPLOYMENT)


class Cluster:
    """One deployment: its etcd view, scripted nodes and (restartable) controller."""

    def __init__(self, stack: dict[str, Any], etcd: EtcdClient, deployment: Deployment) -> None:
        self.stack = stack
        self.deployment = deployment
        self.etcd = etcd.within(deployment.etcd_namespace)
        self.nodes = ScriptedNodes(self.etcd)
        self.node: Node | None = None
        self.running: Running | None = None

    async def start(self) -> Running:
        assert self.node is not None
        settings = settings_for(self.stack, [self.node], min=3, batch=3)
        settings = replace(settings, deployment=self.deployment)
        controller = Controller(settings, self.etcd, connect(settings.neutron), election_ttl=5)
        self.running = Running(controller, asyncio.create_task(controller.run()))
        await eventually(lambda: _serving(self.running), f"{self.deployment.name} serving", 60)
        return self.running

    async def restart(self) -> Running:
        assert self.running is not None
        await self.running.stop()
        await self.etcd.delete(ELECTION)  # the stopped leader's lease would hold it for a TTL
        return await self.start()

    async def close(self) -> None:
        if self.running is not None:
            await self.running.stop()
        await self.nodes.cleanup()
        await self.etcd.delete(ELECTION)


async def _serving(running: Running | None) -> bool:
    assert running is not None
    if running.task.done():
        running.task.result()
    return bool(running.controller.port and running.service.serving)


@pytest.fixture
async def clusters(
    stack: dict[str, Any], etcd: EtcdClient
) -> AsyncIterator[tuple[Cluster, Cluster]]:
    pair = (Cluster(stack, etcd, DEFAULT), Cluster(stack, etcd, SECOND))
    try:
        for cluster in pair:
            cluster.node = await cluster.nodes.add()
        yield pair
    finally:
        for cluster in pair:
            await cluster.close()


@pytest.fixture
def second_network(neutron: Any, project_id: str) -> Any:
    return make_network(neutron, project_id, "pw-ctl-b", "10.78.0.0/22")


def tagged(neutron: Any, network: Any, deployment: Deployment) -> set[str]:
    ports = neutron.network.ports(network_id=network.id, tags=deployment.tag)
    return {str(p.id) for p in ports}


async def churn(http: aiohttp.ClientSession, cluster: Cluster, network: Any, n: int) -> list[str]:
    """``n`` pods started and every other one stopped again; the held ports' ids."""
    assert cluster.running is not None and cluster.node is not None
    held = []
    for index in range(n):
        attachment = f"{cluster.deployment.name}-{index}:eth0"
        status, got = await request_vif(
            http, cluster.running.url, cluster.node, vif_body(attachment, network)
        )
        assert status == 200, got
        if index % 2:
            gone = await release_vif(http, cluster.running.url, cluster.node, attachment)
            assert gone == 204
        else:
            held.append(got["vif"]["port_id"])
    return held


@pytest.mark.parametrize("source", ["mirror", "listing"])
async def test_two_deployments_on_one_neutron_never_touch_each_others_ports(
    clusters: tuple[Cluster, Cluster],
    network: Any,
    neutron: Any,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    second_network: Any,
) -> None:
    """``listing``: recovery lists Neutron's ports, as when the forwarder's report is in
    doubt, and pools the bound ones it finds; ``mirror``: it reads the ml2 driver's keys."""
    if source == "listing":
        monkeypatch.setattr(recovery, "pools_from_mirror", _no_mirror)
    first, second = clusters
    networks = {DEFAULT.name: network, SECOND.name: second_network}  # one each: see below
    for cluster in clusters:
        await cluster.start()
    held = {
        c.deployment.name: await churn(http, c, networks[c.deployment.name], 6) for c in clusters
    }
    for cluster in clusters:
        assert cluster.running is not None
        await cluster.running.service.drain()
    ports = {
        c.deployment.name: tagged(neutron, networks[c.deployment.name], c.deployment)
        for c in clusters
    }
    for name, net in networks.items():
        every = {str(p.id) for p in neutron.network.ports(network_id=net.id)}
        assert ports[name] and ports[name] == every - _dhcp(neutron, net)
    for cluster in clusters:
        assert set(held[cluster.deployment.name]) <= ports[cluster.deployment.name]

    # The ml2 driver wrote each host's desired ports into its own deployment's namespace only.
    assert first.node is not None and second.node is not None
    desired = await second.etcd.get_prefix(keys.node_ports_prefix(second.node.name))
    assert {kv.key.rsplit("/", 1)[1] for kv in desired[0]} == ports[SECOND.name]
    leaked, _ = await first.etcd.get_prefix(keys.node_ports_prefix(second.node.name))
    assert leaked == []
    # ... and reads its agents' reports there: a port wired on the second deployment's host
    # goes ACTIVE in Neutron.
    wired = held[SECOND.name][0]
    state = keys.state_port(second.node.name, wired)
    await second.etcd.put(state, values.port_state_value(time.time()))
    await eventually(lambda: _active(neutron, wired), "the wired port ACTIVE")

    for restarted, other in ((first, second), (second, first)):
        before = tagged(neutron, networks[other.deployment.name], other.deployment)
        running = await restarted.restart()  # recovery lists Neutron's ports again
        assert running.controller.sweeper is not None
        await running.controller.sweeper.sweep_once()  # nodes without an alive key: freed
        await running.controller.sweeper.sweep_once()  # unbound twice in a row: deleted
        name = restarted.deployment.name
        await churn(http, restarted, networks[name], 4)
        assert tagged(neutron, networks[other.deployment.name], other.deployment) == before
        assert not any(running.service.knows(p) for p in before)
        assert set(held[name]) <= tagged(neutron, networks[name], restarted.deployment)


async def _active(neutron: Any, port_id: str) -> bool:
    return bool(neutron.network.get_port(port_id).status == "ACTIVE")


async def _no_mirror(*_args: Any) -> None:
    return None


def _dhcp(neutron: Any, network: Any) -> set[str]:
    """Ports of Neutron's own (DHCP) on the network, which no deployment owns."""
    ports = neutron.network.ports(network_id=network.id)
    return {str(p.id) for p in ports if not str(p.device_owner).startswith("compute:")}


async def test_the_default_deployment_adopts_untagged_ports_the_other_never_sees(
    clusters: tuple[Cluster, Cluster],
    network: Any,
    neutron: Any,
) -> None:
    first, second = clusters
    assert first.node is not None
    old = neutron.network.create_port(  # as podwire made them before deployments existed
        network_id=network.id,
        project_id=network.project_id,
        device_owner="compute:podwire",
        binding_host_id=first.node.name,
    )
    try:
        await second.start()
        assert second.running is not None
        assert not second.running.service.knows(str(old.id))
        assert neutron.network.get_port(old.id).tags == []
        running = await first.start()
        await eventually(lambda: _knows(running, str(old.id)), "the old port pooled")
        # Tagged by the listing that checks the mirror against Neutron (or recovery's own).
        await eventually(lambda: _tagged(neutron, old.id), "the old port adopted")
        assert second.running.controller.sweeper is not None
        for _ in range(2):
            await second.running.controller.sweeper.sweep_once()
        assert neutron.network.get_port(old.id).id == old.id
    finally:
        with contextlib.suppress(Exception):
            neutron.network.delete_port(old.id)


async def _tagged(neutron: Any, port_id: str) -> bool:
    return bool(neutron.network.get_port(port_id).tags == [DEFAULT.tag])


async def _knows(running: Running, port_id: str) -> bool:
    return bool(running.service.knows(port_id))


async def test_a_host_alive_in_two_deployments_is_not_bound(
    clusters: tuple[Cluster, Cluster], network: Any, neutron: Any, etcd: EtcdClient
) -> None:
    _first, second = clusters
    assert second.node is not None
    twin = ScriptedNodes(etcd)  # the same host name registered in the default deployment too
    twin_node = await twin.add()
    try:
        await second.etcd.put(
            keys.state_alive(twin_node.name),
            (await etcd.get(keys.state_alive(twin_node.name))).value,  # type: ignore[union-attr]
            lease=(await second.etcd.grant_lease(60)).id,
        )
        for key in (keys.state_vtep(twin_node.name), keys.state_capabilities(twin_node.name)):
            value = await etcd.get(key)
            assert value is not None
            await second.etcd.put(key, value.value)

        async def refused() -> bool:
            port = neutron.network.create_port(
                network_id=network.id,
                project_id=network.project_id,
                device_owner="compute:podwire",
                binding_host_id=twin_node.name,
            )
            neutron.network.delete_port(port.id)
            return bool(port.binding_vif_type == "binding_failed")

        await eventually(refused, "binding refused for a host in two deployments")
    finally:
        await delete_prefix(second.etcd, keys.state_node_prefix(twin_node.name))
        await twin.cleanup()


async def test_status_of_the_second_deployment_names_the_forwarder(
    clusters: tuple[Cluster, Cluster], stack: dict[str, Any]
) -> None:
    """Its election lives in the first deployment's namespace; the report it publishes in
    every namespace names it, so `podwire status` of either deployment finds no problem there."""
    _first, second = clusters
    assert second.node is not None
    settings = replace(settings_for(stack, [second.node]), deployment=SECOND)
    settings = replace(settings, etcd=EtcdSettings(endpoints=[stack["etcd"]]))

    async def named() -> bool:
        report = await collect(settings)
        return report.leaders.get("forwarder") is not None

    await eventually(named, "the forwarder named in the second deployment's status")
    report = await collect(settings)
    assert [n.host for n in report.nodes] == [second.node.name]
    assert not [p for p in report.problems if "forwarder" in p], report.problems


async def test_a_network_one_deployment_uses_refuses_another_deployments_host(
    clusters: tuple[Cluster, Cluster], network: Any, neutron: Any
) -> None:
    """Agents learn their peers from their own deployment only: a port of the second
    deployment's host on a network the first one uses would be bound and reach nothing."""
    first, second = clusters
    assert first.node is not None and second.node is not None

    def port_on(host: str) -> Any:
        return neutron.network.create_port(
            network_id=network.id,
            project_id=network.project_id,
            device_owner="compute:podwire",
            binding_host_id=host,
        )

    ours = port_on(first.node.name)
    assert ours.binding_vif_type == "veth"
    theirs = port_on(second.node.name)
    assert theirs.binding_vif_type == "binding_failed"
    neutron.network.delete_port(theirs.id)
    neutron.network.delete_port(ours.id)
    alone = port_on(second.node.name)  # the network is no one's now
    assert alone.binding_vif_type == "veth"
    neutron.network.delete_port(alone.id)
