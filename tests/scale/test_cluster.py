"""A 3-member etcd and two neutron-servers: members, the leader and a neutron-server are lost
while watches, pods and bindings go on (issue #15)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.agent.app import Agent
from podwire.agent.vifs.controller_vifs import ControllerVifSource
from podwire.config import (
    AgentSettings,
    ControllerSettings,
    EtcdSettings,
    NeutronSettings,
    PoolSettings,
    Settings,
)
from podwire.controller.app import Controller
from podwire.controller.inuse import InUseStore
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher, WatchEvent
from podwire.neutron.client import connect
from podwire.schema.inuse import InUse, PoolKey
from podwire.schema.records import parse_leader
from podwire.schema.vif import Vif, VifRequest
from tests.etcd_tools import delete_prefix
from tests.scale.cluster import Cluster
from tests.scripted_agent import ScriptedAgent, eventually

pytestmark = pytest.mark.slow

ADMIN = "admin-token"


async def _writer(cluster: Cluster, first: int) -> EtcdClient:
    """A client that starts on member ``first`` (the leader: its writes are never ambiguous)."""
    order = cluster.endpoints[first:] + cluster.endpoints[:first]
    return await EtcdClient.connect(EtcdSettings(endpoints=order, timeout=5.0))


async def _follow(watcher: PrefixWatcher, seen: list[WatchEvent], listed: asyncio.Event) -> None:
    async with contextlib.aclosing(watcher.batches()) as batches:
        async for batch in batches:
            if not listed.is_set():
                listed.set()  # the first batch is the listing of an empty prefix
                continue
            seen.extend(batch.events)


@pytest.mark.parametrize("fault", ["kill", "freeze"])
async def test_watch_sees_every_change_once_in_order_across_a_member_loss(
    cluster: Cluster, fault: str
) -> None:
    """The watch runs on a follower that is then lost (the leader's loss is the pod test's);
    the writer stays on the leader, so none of its writes is ambiguous."""
    prefix = f"/test-scale/{uuid.uuid4().hex[:8]}/"
    victim = cluster.follower()
    victim_index = int(victim.split("-")[1]) - 1
    leader_index = int(cluster.leader().split("-")[1]) - 1
    ordered = [cluster.endpoints[victim_index]]
    ordered += [e for i, e in enumerate(cluster.endpoints) if i != victim_index]
    watch_client = await EtcdClient.connect(EtcdSettings(endpoints=ordered, timeout=2.0))
    assert watch_client.endpoint.index == 0
    watcher = PrefixWatcher(watch_client, prefix, probe_interval=0.5)
    seen: list[WatchEvent] = []
    listed = asyncio.Event()
    follow = asyncio.create_task(_follow(watcher, seen, listed))
    writer = await _writer(cluster, leader_index)
    written: list[tuple[str, str, bytes]] = []
    try:
        await asyncio.wait_for(listed.wait(), 10)
        for i in range(60):
            key = f"{prefix}k{i % 7}"
            if i % 5 == 4:
                await writer.delete(key)
                written.append(("delete", key, b""))
            else:
                await writer.put(key, f"v{i}".encode())
                written.append(("put", key, f"v{i}".encode()))
            if i == 20:
                (cluster.kill if fault == "kill" else cluster.freeze)(victim)
            await asyncio.sleep(0.02)

        absent = {i for i, w in enumerate(written) if w[0] == "delete" and not _existed(written, i)}
        expected = [w for i, w in enumerate(written) if i not in absent]  # etcd sends no event

        async def caught_up() -> bool:
            return len(seen) >= len(expected)

        with contextlib.suppress(AssertionError):
            await eventually(caught_up, "every change through the watch", timeout=20)
        await asyncio.sleep(0.3)  # nothing more may come
        assert [(e.kind, e.key, e.value) for e in seen] == expected
        assert watch_client.endpoint.index != 0  # the watch left the lost member
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
        with contextlib.suppress(Exception):
            await delete_prefix(writer, prefix)
        await writer.close()
        await watch_client.close()
        if fault == "kill":
            cluster.restart(victim)
        else:
            cluster.thaw(victim)


def _existed(written: list[tuple[str, str, bytes]], index: int) -> bool:
    """Whether the key deleted at ``index`` existed then (etcd sends no event otherwise)."""
    key = written[index][1]
    for kind, other, _ in reversed(written[:index]):
        if other == key:
            return kind == "put"
    return False


# --- pods and bindings through a leader loss -----------------------------------------------


def _settings(
    cluster: Cluster, tmp: Path, hosts: list[str], url: str = "", vtep: str = "192.0.2.50"
) -> Settings:
    return Settings(
        etcd=EtcdSettings(endpoints=cluster.endpoints, timeout=2.0),
        neutron=NeutronSettings(endpoint=cluster.info["neutron"]),
        controller=ControllerSettings(
            listen="127.0.0.1:0", admin_token=ADMIN, node_tokens={h: f"t-{h}" for h in hosts}
        ),
        pool=PoolSettings(
            min=3, batch=4, update_interval=0.5, idle_ttl=60.0, node_cleanup_interval=3600.0
        ),
        agent=AgentSettings(
            controller_url=url or "http://127.0.0.1:1",
            state_dir=str(tmp),
            vtep_ip=vtep,
            heartbeat_ttl=10,
            dataplane="none",
        ),
    )


@pytest.fixture
async def project(cluster_neutron: list[Any]) -> AsyncIterator[tuple[str, Any]]:
    project_id = uuid.uuid4().hex
    network = cluster_neutron[0].network.create_network(name="scale", project_id=project_id)
    cluster_neutron[0].network.create_subnet(
        network_id=network.id, project_id=project_id, ip_version=4, cidr="10.77.0.0/20"
    )
    yield project_id, network
    for port in cluster_neutron[0].network.ports(network_id=network.id):
        with contextlib.suppress(Exception):
            cluster_neutron[0].network.delete_port(port)
    with contextlib.suppress(Exception):
        cluster_neutron[0].network.delete_network(network)


async def test_pods_and_bindings_go_on_through_leader_and_member_loss(
    cluster: Cluster, cluster_etcd: EtcdClient, project: tuple[str, Any], tmp_path: Path
) -> None:
    project_id, network = project
    hosts = [f"sc-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    base = _settings(cluster, tmp_path, hosts)
    controller = Controller(base, cluster_etcd, connect(base.neutron), election_ttl=5)
    tasks = [asyncio.create_task(controller.run())]
    agents: list[Agent] = []
    try:

        async def serving() -> bool:
            return (await controller.ready())[0]

        await eventually(serving, "controller serving", timeout=30)
        url = f"http://127.0.0.1:{controller.port}"
        for i, host in enumerate(hosts):
            s = _settings(cluster, tmp_path / host, hosts, url, vtep=f"192.0.2.{50 + i}")
            agent = Agent(
                Settings(
                    etcd=s.etcd,
                    agent=AgentSettings(**{**vars(s.agent), "host": host, "token": f"t-{host}"}),
                )
            )
            agents.append(agent)
            tasks.append(asyncio.create_task(agent.run()))
            await asyncio.wait_for(agent.parts.started.wait(), 30)
            assert agent.parts.handler is None  # dataplane "none": no CNI socket
        sources = [ControllerVifSource(url, h, f"t-{h}") for h in hosts]
        failures: list[str] = []
        done = 0

        async def churn(n: int) -> None:
            nonlocal done
            for source, agent in zip(sources, agents, strict=True):
                req = VifRequest(
                    attachment=f"c{n}:eth0",
                    network=network.id,
                    project_id=project_id,
                    security_groups=(),
                )
                try:
                    loop = asyncio.get_running_loop()
                    vif = await source.request(req, loop.time() + 30)
                    assert agent.parts.binder is not None
                    await agent.parts.binder.wait_wired(vif.port_id, 30)
                    await source.release(req.attachment, vif)
                    done += 1
                except Exception as exc:  # collected: the assertion names every failure
                    failures.append(f"{type(exc).__name__}: {exc}")

        killed = frozen = ""
        for n in range(40):
            if n == 10:  # the leader dies while pods come and go and refills bind ports
                killed = cluster.leader()
                cluster.kill(killed)
            if n == 20:
                cluster.restart(killed)
            if n == 25:  # a member stops answering (SIGSTOP: connections stay open)
                frozen = cluster.follower()
                cluster.freeze(frozen)
            if n == 35:
                cluster.thaw(frozen)
            await churn(n)
            await asyncio.sleep(0.05)
        assert failures == []
        assert done == 80
        for source in sources:
            await source.close()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        cluster.heal()
        for host in hosts:
            await delete_prefix(cluster_etcd, keys.state_node_prefix(host))
            await delete_prefix(cluster_etcd, keys.vifs_prefix(host))


# --- the forwarder moves to the other neutron-server --------------------------------------


def _server_of(cluster: Cluster, worker_pid: int) -> str:
    """Which stack child (``neutron`` / ``neutron-2``) the gunicorn worker belongs to."""
    with open(f"/proc/{worker_pid}/stat") as stat:
        parent = int(stat.read().rsplit(")", 1)[1].split()[1])
    return next(str(name) for name, pid in cluster.info["pids"].items() if pid == parent)


async def test_forwarder_moves_to_the_other_neutron_server_without_losing_a_row(
    cluster: Cluster,
    cluster_etcd: EtcdClient,
    cluster_neutron: list[Any],
    project: tuple[str, Any],
) -> None:
    project_id, network = project
    host = ScriptedAgent(cluster_etcd, f"fw-{uuid.uuid4().hex[:8]}")
    await host.register()

    async def leader() -> int | None:
        kv = await cluster_etcd.get(keys.election("forwarder"))
        return int(parse_leader(kv.value).rsplit(":", 1)[1]) if kv else None

    worker = await eventually(leader, "a forwarder elected")
    holder = _server_of(cluster, worker)
    other = 1 if holder == "neutron" else 0
    frozen = [cluster.info["pids"][holder], worker]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    net = cluster_neutron[other].network
    try:
        ports = [
            net.create_port(
                network_id=network.id,
                project_id=project_id,
                device_owner="compute:podwire",
                binding_host_id=host.host,
            )
            for _ in range(6)
        ]
        for port in ports[::2]:
            net.delete_port(port)  # a delete journaled after its create must win
        kept = {str(p.id) for p in ports[1::2]}

        async def desired() -> bool:
            items, _ = await cluster_etcd.get_prefix(keys.node_ports_prefix(host.host))
            return {kv.key.rsplit("/", 1)[1] for kv in items} == kept

        await eventually(desired, "the other server's forwarder sent every row", timeout=40)
        new_worker = await leader()
        assert new_worker is not None and _server_of(cluster, new_worker) != holder
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    await asyncio.sleep(1.0)  # the woken forwarder is fenced: it writes nothing stale
    assert await desired()
    await host.cleanup()


# --- in-use records through a leader loss --------------------------------------------------


async def test_in_use_writes_ride_out_a_leader_loss_without_an_error(
    cluster: Cluster, cluster_etcd: EtcdClient
) -> None:
    """A write lost with the dead leader is sent again, so no VIF request fails because of it."""
    node = f"iu-{uuid.uuid4().hex[:6]}"
    retries: list[int] = []
    store = InUseStore(cluster_etcd, lambda: [], lambda: retries.append(1))
    vif = Vif(str(uuid.uuid4()), str(uuid.uuid4()), uuid.uuid4().hex, "fa:16:3e:00:00:01", 1450, [])
    key = PoolKey(node, vif.project_id, vif.network_id)
    try:
        writes = []
        for n in range(60):
            if n == 10:
                cluster.kill(cluster.leader())
            record = InUse(node, f"c{n}:eth0", key, vif)
            writes.append(asyncio.create_task(store.put(record)))
            await asyncio.sleep(0.05)
        await asyncio.gather(*writes)  # every one succeeded
        assert retries, "the leader loss cost no write a retry: the test did not test it"
        items, _ = await cluster_etcd.get_prefix(keys.vifs_prefix(node))
        assert len(items) == 60
    finally:
        await delete_prefix(cluster_etcd, keys.vifs_prefix(node))
