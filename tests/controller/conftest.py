"""Controller test helpers: scripted nodes in etcd, a network per test, controllers in-process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.config import ControllerSettings, NeutronSettings, PoolSettings, Settings
from podwire.controller.app import Controller
from podwire.controller.leader import ELECTION
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect
from tests.etcd_tools import delete_prefix
from tests.scripted_agent import eventually

ADMIN = "admin-secret"


@dataclass
class Node:
    name: str
    token: str


class ScriptedNodes:
    """Plays node agents: alive (leased), VTEP and physnets, so ports bind to these hosts."""

    def __init__(self, etcd: EtcdClient) -> None:
        self.etcd = etcd
        self.made: list[Node] = []
        self.leases: dict[str, Any] = {}

    async def add(self, pod_driver: str | None = None) -> Node:
        node = Node(f"n-{uuid.uuid4().hex[:10]}", uuid.uuid4().hex)
        self.made.append(node)
        await self.etcd.put(keys.state_vtep(node.name), b'{"v":1,"ip":"192.0.2.10"}')
        await self.etcd.put(keys.state_physnet(node.name, "physnet1"), b'{"v":1,"interface":"e1"}')
        caps: dict[str, Any] = {"v": 1, "vif_types": ["veth"], "network_types": ["vxlan"]}
        if pod_driver:
            caps["pod_driver"] = pod_driver
        await self.etcd.put(keys.state_capabilities(node.name), json.dumps(caps).encode())
        lease = await self.etcd.grant_lease(120)
        self.leases[node.name] = lease
        alive = json.dumps({"v": 1, "started_at": time.time(), "version": "test"}).encode()
        await self.etcd.put(keys.state_alive(node.name), alive, lease=lease.id)
        return node

    async def kill(self, node: Node) -> None:
        await self.leases.pop(node.name).revoke()

    async def cleanup(self) -> None:
        for lease in self.leases.values():
            await lease.revoke()
        for node in self.made:
            await delete_prefix(self.etcd, keys.state_node_prefix(node.name))
            await delete_prefix(self.etcd, keys.vifs_prefix(node.name))


@pytest.fixture
async def nodes(etcd: EtcdClient) -> AsyncIterator[ScriptedNodes]:
    made = ScriptedNodes(etcd)
    yield made
    await made.cleanup()


def make_network(neutron: Any, project_id: str, name: str, cidr: str) -> Any:
    """A network with one IPv4 subnet in the test's project (removed with the project)."""
    net = neutron.network.create_network(project_id=project_id, name=name)
    neutron.network.create_subnet(project_id=project_id, network_id=net.id, cidr=cidr, ip_version=4)
    return net


@pytest.fixture
def other_project(neutron: Any) -> Iterator[str]:
    """A second project of this test's own (its trunks, networks and groups go afterwards)."""
    project = uuid.uuid4().hex
    yield project
    for trunk in list(neutron.network.trunks(project_id=project)):
        neutron.network.delete_trunk(trunk)
    for network in list(neutron.network.networks(project_id=project)):
        for port in list(neutron.network.ports(network_id=network.id)):  # also other projects'
            neutron.network.delete_port(port)
        neutron.network.delete_network(network)
    for sg in list(neutron.network.security_groups(project_id=project)):
        neutron.network.delete_security_group(sg)


@pytest.fixture
def network(neutron: Any, project_id: str) -> Any:
    return make_network(neutron, project_id, "pw-ctl", "10.77.0.0/22")


@pytest.fixture
def sgs(neutron: Any, project_id: str) -> Iterator[list[str]]:
    made = [
        neutron.network.create_security_group(project_id=project_id, name=f"sg{i}")
        for i in range(3)
    ]
    yield [str(sg.id) for sg in made]
    for sg in made:
        with contextlib.suppress(Exception):
            neutron.network.delete_security_group(sg)


def settings_for(
    stack: dict[str, Any], nodes: list[Node], endpoint: str | None = None, **pool: Any
) -> Settings:
    # Fixed sizes: these tests count ports; adaptive sizing has its own tests (test_sizing*).
    base = {
        "min": 2,
        "batch": 3,
        "update_interval": 3600.0,
        "recycle_on_release": False,  # the tests recycle when they choose
        "node_cleanup_interval": 3600.0,
        "adaptive": False,
    }
    return Settings(
        neutron=NeutronSettings(endpoint=endpoint or stack["neutron"]),
        controller=ControllerSettings(
            listen="127.0.0.1:0",
            admin_token=ADMIN,
            node_tokens={n.name: n.token for n in nodes},
        ),
        pool=replace(PoolSettings(), **{**base, **pool}),
    )


class Running:
    def __init__(self, controller: Controller, task: asyncio.Task[None]) -> None:
        self.controller = controller
        self.task = task

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.controller.port}"

    @property
    def service(self) -> Any:
        return self.controller.service

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


@pytest.fixture
async def controllers(etcd: EtcdClient) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    """Start controllers in this event loop; ``wait_ready=False`` for standbys."""
    started: list[Running] = []

    async def start(settings: Settings, wait_ready: bool = True, ttl: int = 10) -> Running:
        ctl = Controller(settings, etcd, connect(settings.neutron), election_ttl=ttl)
        running = Running(ctl, asyncio.create_task(ctl.run()))
        started.append(running)
        await eventually(lambda: _bound(ctl), "http listening")
        if wait_ready:
            await eventually(lambda: _ready(running), "controller ready", timeout=60)
            # The test calls the service directly, as the term's own work would: decided in
            # this term, so its Neutron writes are refused once the term ends.
            ctl.term.join()
        return running

    yield start
    for running in started:
        await running.stop()
    await etcd.delete(ELECTION)


def pooled_ports(running: Running, key: Any) -> set[str]:
    """Port ids free in one pool of a running controller, whatever their SG group, also
    those not in the forwarder's mirror yet."""
    pools = running.service.pools
    return {p for _, ports in pools.groups(key) for p in ports} | set(pools.unseen(key))


async def _bound(ctl: Controller) -> bool:
    return ctl.port != 0


async def _ready(running: Running) -> bool:
    if running.task.done():
        running.task.result()
    return running.service.serving  # type: ignore[no-any-return]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def vif_body(attachment: str, network: Any, sgs: list[str] | None = None) -> dict[str, Any]:
    return {
        "attachment": attachment,
        "network": network.id,
        "project_id": network.project_id,
        "security_groups": sgs or [],
        "pod": {"namespace": "default", "name": attachment, "uid": str(uuid.uuid4())},
    }


async def request_vif(
    http: aiohttp.ClientSession, base: str, node: Node, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    async with http.post(
        f"{base}/v1/nodes/{node.name}/vifs",
        json=body,
        headers={"Authorization": f"Bearer {node.token}"},
    ) as response:
        return response.status, await response.json(content_type=None)


async def release_vif(http: aiohttp.ClientSession, base: str, node: Node, att: str) -> int:
    async with http.delete(
        f"{base}/v1/nodes/{node.name}/vifs/{att}",
        headers={"Authorization": f"Bearer {node.token}"},
    ) as response:
        return response.status


async def admin(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> tuple[int, Any]:
    async with http.request(
        method, url, json=body, headers={"Authorization": f"Bearer {ADMIN}"}
    ) as response:
        return response.status, await response.json(content_type=None)
