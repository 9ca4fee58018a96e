"""Every component serves again, with no restart, after etcd froze for longer than every TTL.

The etcd is a private one (SIGSTOP would freeze every other test on the session's): the
controller, an ml2 worker (forwarder and feedback, on a journal table of the test's own) and an
agent on a simulated host all use it, with 2 s leases and a 1 s call timeout. Neutron and
MariaDB are the session's. How fast they are back is bench/heal_bench.py's business; here
"eventually" is generous.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.config import EtcdSettings
from podwire.controller.app import Controller
from podwire.errors import RetryableError
from podwire.etcd.client import EtcdClient, Lease
from podwire.ml2.forwarder import ForwarderSettings
from podwire.ml2.host_cache import HostDirectory
from podwire.ml2.journal import SqlJournal
from podwire.ml2.worker import Worker
from podwire.neutron.client import connect
from podwire.schema import nodes as values
from podwire.schema.deployment import Deployment
from podwire.stack.netutil import free_port
from tests.agent.desired_keys import desired_value
from tests.agent.harness import HostAgent, acni, plugin_binary
from tests.agent.netenv import NetEnv
from tests.controller.conftest import ScriptedNodes, request_vif, settings_for, vif_body
from tests.etcd.conftest import PrivateEtcd
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack

TTL = 2  # every lease in this test
STALL = 6.0  # seconds: three TTLs, so etcd and every holder must consider the leases gone
BACK = 90.0  # the generous "eventually"


@dataclass
class RecordingSink:
    """Neutron as feedback sees it, recording instead of calling (feedback's Neutron side is
    tested in tests/ml2 against the real Neutron)."""

    wired: list[tuple[str, str]] = field(default_factory=list)

    def port_wired(self, host: str, port_id: str) -> bool:
        self.wired.append((host, port_id))
        return True

    def port_settled(self, host: str, port_id: str) -> bool:
        return False

    def port_unwired(self, host: str, port_id: str) -> bool:
        return False

    def host_down(self, host: str) -> int:
        return 0


@dataclass
class Everything:
    client: EtcdClient
    controller: Controller
    worker: Worker
    sink: RecordingSink
    journal: SqlJournal
    agent: HostAgent
    node: Any
    network: Any
    http: aiohttp.ClientSession
    plugin: Path
    fed_host: str = field(default_factory=lambda: f"fb-{uuid.uuid4().hex[:8]}")
    fed_lease: Lease | None = None


async def until_etcd_answers(what: Any) -> Any:
    """The first call after the stall may still meet the channel's reconnect backoff."""

    async def attempt() -> Any:
        try:
            return (await what(),)
        except RetryableError:
            return None

    return (await eventually(attempt, "etcd answering again", timeout=BACK))[0]


async def controller_serves(world: Everything, phase: str) -> None:
    url = f"http://127.0.0.1:{world.controller.port}"

    async def ready() -> bool:
        async with world.http.get(url + "/readyz") as response:
            return response.status == 200

    await eventually(ready, f"controller ready ({phase})", timeout=BACK)
    status, body = await request_vif(
        world.http, url, world.node, vif_body(f"{phase}:eth0", world.network)
    )
    assert status == 200, body


async def forwarder_serves(world: Everything, phase: str) -> None:
    key = f"/podwire-test/stall/{phase}"
    await asyncio.to_thread(world.journal.append, key, phase)
    world.worker.kick()

    async def arrived() -> bool:
        return await world.client.get(key) is not None

    await eventually(arrived, f"journal row forwarded ({phase})", timeout=BACK)


async def feedback_serves(world: Everything, phase: str) -> None:
    host, port = world.fed_host, str(uuid.uuid4())
    if world.fed_lease is None:
        world.fed_lease = await world.client.grant_lease(600)
        alive = values.alive_value(time.time(), "test")
        await world.client.put(keys.state_alive(host), alive, lease=world.fed_lease.id)
    state = values.port_state_value(time.time())
    await until_etcd_answers(lambda: world.client.put(keys.state_port(host, port), state))

    async def acted() -> bool:
        return (host, port) in world.sink.wired

    await eventually(acted, f"feedback reported the wired port ({phase})", timeout=BACK)


async def agent_serves(world: Everything, phase: str) -> None:
    agent = world.agent

    async def ready() -> bool:
        async with world.http.get(f"http://{agent.ops_listen}/readyz") as response:
            return response.status == 200

    await eventually(ready, f"agent ready ({phase})", timeout=BACK)
    status = await acni(world.plugin, "STATUS", agent.conf("pw-stall"))
    assert status.code == 0, status.stdout
    port, net = str(uuid.uuid4()), str(uuid.uuid4())
    fixed = [
        {
            "ip_address": "10.9.0.5",
            "subnet_id": "s",
            "cidr": "10.9.0.0/24",
            "gateway_ip": "10.9.0.1",
        }
    ]
    value = desired_value(port, net, "fa:16:3e:00:00:09", fixed, segmentation_id=4100)
    await until_etcd_answers(lambda: world.client.put(keys.node_port(agent.host, port), value))

    async def wired() -> bool:
        return await world.client.get(keys.state_port(agent.host, port)) is not None

    await eventually(wired, f"agent wired a new desired port ({phase})", timeout=BACK)
    await world.client.delete(keys.node_port(agent.host, port))


async def everything_serves(world: Everything, phase: str) -> None:
    await controller_serves(world, phase)
    await forwarder_serves(world, phase)
    await feedback_serves(world, phase)
    await agent_serves(world, phase)


@contextlib.asynccontextmanager
async def mirror_relay(session: EtcdClient, private: EtcdClient, node: str) -> AsyncIterator[None]:
    """Neutron is the session's, so its ml2 driver mirrors the pool's bound ports into the
    session's etcd; the controller here follows the private one and hands out a port only
    once the mirror there shows it. This copies the node's mirror across, through the stall
    (where a deployment has one etcd for both)."""

    async def relay() -> None:
        copied: dict[str, bytes] = {}
        while True:
            entries, _ = await session.get_prefix(keys.node_ports_prefix(node))
            for entry in entries:
                if copied.get(entry.key) != entry.value:
                    with contextlib.suppress(RetryableError):
                        await private.put(entry.key, entry.value)
                        copied[entry.key] = entry.value
            await asyncio.sleep(0.1)

    task = asyncio.create_task(relay())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def running_controller(
    stack: dict[str, Any], client: EtcdClient, etcd_settings: EtcdSettings, node: Any
) -> AsyncIterator[Controller]:
    settings = replace(settings_for(stack, [node], min=0, batch=1), etcd=etcd_settings)
    controller = Controller(settings, client, connect(settings.neutron), election_ttl=TTL)
    task = asyncio.create_task(controller.run())
    try:
        yield controller
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise AssertionError("the controller stopped on its own") from task.exception()


async def test_every_component_serves_again_after_etcd_stall(
    private_etcd: PrivateEtcd,
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    http: aiohttp.ClientSession,
    netenv: NetEnv,
    own_journal: tuple[SqlJournal, str, str],
    etcd: EtcdClient,
    tmp_path: Path,
) -> None:
    settings = EtcdSettings(endpoints=[private_etcd.server.client_url], timeout=1.0)
    node = await nodes.add()  # alive in the session's etcd, so Neutron binds the pool's ports
    ns, vtep = netenv.host(1)
    agent = HostAgent(
        f"{netenv.tag}-h1",
        ns,
        vtep,
        tmp_path,
        settings,
        stack["neutron"],
        ops_listen=f"127.0.0.1:{free_port()}",
        heartbeat_ttl=TTL,
    )
    sink = RecordingSink()
    journal = own_journal[0]
    forwarding = ForwarderSettings(identity="stall-test", lease_ttl=TTL, poll_interval=0.2)
    worker = Worker(settings, HostDirectory([Deployment()]), journal, sink, forwarding)
    async with (
        await EtcdClient.connect(settings) as client,
        mirror_relay(etcd, client, node.name),
        running_controller(stack, client, settings, node) as controller,
    ):
        worker.start()
        # The controller (on the private etcd) fills pools only for nodes alive there too.
        lease = await client.grant_lease(600)
        alive = values.alive_value(time.time(), "test")
        await client.put(keys.state_alive(node.name), alive, lease=lease.id)
        try:
            await agent.start()
            world = Everything(
                client, controller, worker, sink, journal, agent, node, network, http,
                plugin_binary("c", tmp_path),
            )  # fmt: skip
            await everything_serves(world, "before")
            assert agent.agent is not None and agent.agent.parts.heartbeat is not None
            heartbeat = agent.agent.parts.heartbeat
            terms = controller.leadership.terms

            await private_etcd.stall(STALL)

            await everything_serves(world, "after")
            # it healed by itself: a new controller term, a new heartbeat lease
            assert controller.leadership.terms > terms
            assert controller.leadership.losses >= 1
            assert heartbeat.health.problem is None
            assert await client.get(keys.state_alive(agent.host)) is not None
        finally:
            await agent.stop()
            await asyncio.to_thread(worker.stop)
