"""Whatever one node writes under its own prefix, against two real agents on two simulated
hosts with a pod each: no agent stops or restarts a part, the pods keep talking, CNI keeps
answering, and another node's pod is never moved. The hostile values are written with the
session etcd's root client under two hostile hosts' own prefixes, exactly what those nodes'
etcd users may write (tests/etcd/test_auth.py shows a node's user can write nothing else);
the desired keys that make ports "bound" to a hostile node are written as the forwarder would.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podwire import keys
from podwire.agent import naming
from podwire.etcd import EtcdClient
from podwire.schema import nodes as values
from tests.agent.desired_keys import desired_value
from tests.agent.harness import HostAgent, acni, plugin_binary
from tests.agent.netenv import NetEnv, in_ns, ping_settles
from tests.etcd_tools import delete_prefix
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack

EXAMPLES = int(os.environ.get("PODWIRE_PEER_EXAMPLES", "6"))


@dataclass
class Pod:
    agent: HostAgent
    ns: str
    cid: str
    ip: str
    mac: str
    result: dict[str, Any]


@dataclass
class World:
    agents: list[HostAgent]
    pods: list[Pod]
    network: str
    hostile: list[str]
    bound: dict[str, list[str]]  # hostile host -> port ids Neutron "bound" to it
    etcd: EtcdClient
    tmp: Path


async def _pod(agent: HostAgent, netenv: NetEnv, network: str, tmp: Path) -> Pod:
    ns = netenv.namespace(f"p{uuid.uuid4().hex[:4]}")
    cid = uuid.uuid4().hex
    call = await acni(plugin_binary("c", tmp), "ADD", agent.conf(network), container_id=cid,
                      netns=f"/run/netns/{ns}")  # fmt: skip
    assert call.code == 0, call.stdout
    iface = next(i for i in call.json["interfaces"] if i.get("sandbox"))
    ip = call.json["ips"][0]["address"].split("/")[0]
    return Pod(agent, ns, cid, ip, iface["mac"], call.json)


def _fixed(ip: str) -> dict[str, str]:
    return {"ip_address": ip, "subnet_id": "s", "cidr": "10.77.0.0/24", "gateway_ip": "10.77.0.1"}


@pytest.fixture
async def world(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, etcd: EtcdClient, tmp_path: Path
) -> AsyncIterator[World]:
    pods = [await _pod(agent, netenv, vxnet.id, tmp_path) for agent in agents]
    assert await ping_settles(pods[0].ns, pods[1].ip)
    hostile = [f"{netenv.tag}-evil{i}" for i in range(2)]
    bound: dict[str, list[str]] = {}
    lease = await etcd.grant_lease(60)
    try:
        for index, host in enumerate(hostile):
            await etcd.put(keys.state_vtep(host), values.vtep_value(f"192.0.2.{70 + index}"))
            await etcd.put(keys.state_alive(host), values.alive_value(0, "t"), lease=lease.id)
            bound[host] = []
            for n in range(2):  # ports Neutron bound to the hostile node: its own to claim
                port_id = str(uuid.uuid4())
                mac, ip = f"fa:16:3e:e{index}:00:0{n}", f"10.77.0.{200 + 10 * index + n}"
                value = desired_value(port_id, vxnet.id, mac, [_fixed(ip)])
                await etcd.put(keys.node_port(host, port_id), value)
                bound[host].append(port_id)
        yield World(agents, pods, vxnet.id, hostile, bound, etcd, tmp_path)
    finally:
        await lease.revoke()
        for host in hostile:
            await delete_prefix(etcd, keys.state_node_prefix(host))
            await delete_prefix(etcd, keys.node_prefix(host))
        for pod in pods:
            await acni(plugin_binary("c", tmp_path), "DEL", pod.agent.conf(vxnet.id),
                       container_id=pod.cid, netns=f"/run/netns/{pod.ns}")  # fmt: skip


async def _seen(world: World, revision: int) -> None:
    """Both agents' peer trackers have read up to ``revision``."""

    async def caught_up() -> bool:
        for agent in world.agents:
            assert agent.agent is not None and agent.agent.parts.peers is not None
            if agent.agent.parts.peers.watcher.revision < revision:
                return False
        return True

    await eventually(caught_up, f"the agents reading etcd up to revision {revision}")


async def _still_serving(world: World) -> None:
    """No part restarted or stopped, pods ping both ways, CNI CHECK answers on both hosts,
    each host forwards the other's pod to that host's VTEP."""
    device = naming.vxlan(world.network)
    for agent in world.agents:
        assert agent.task is not None and not agent.task.done()
        assert agent.agent is not None
        restarts = agent.agent.metrics.registry.get_sample_value
        for task in agent.agent.parts.tasks:
            assert task.restarts == 0, (task.name, task.last_error)
            assert not restarts("podwire_agent_task_restarts_total", {"task": task.name})
    a, b = world.pods
    assert await ping_settles(a.ns, b.ip) and await ping_settles(b.ns, a.ip)
    for pod, other in ((a, b), (b, a)):
        check = await acni(
            plugin_binary("c", world.tmp), "CHECK",
            pod.agent.conf(world.network, prevResult=pod.result),
            container_id=pod.cid, netns=f"/run/netns/{pod.ns}",
        )  # fmt: skip
        assert check.code == 0, check.stdout
        fdb = in_ns(pod.agent.netns, "bridge", "fdb", "show", "dev", device).stdout
        assert f"{other.mac} dst {other.agent.vtep} self permanent" in fdb, fdb


async def test_tied_claims_of_a_nodes_own_ports_stop_no_agent(world: World) -> None:
    """#44: two claims from one node with the same ``wired_at`` (0, or two ports wired in one
    clock tick) once made every agent exit; both are its own ports, so both count."""
    host = world.hostile[0]
    revision = 0
    for port_id in [*world.bound[host], str(uuid.uuid4()), str(uuid.uuid4())]:
        revision = await world.etcd.put(keys.state_port(host, port_id), _claim(0, None))
    await _seen(world, revision)
    device = naming.vxlan(world.network)
    for agent in world.agents:
        fdb = in_ns(agent.netns, "bridge", "fdb", "show", "dev", device).stdout
        for n in range(2):
            assert f"fa:16:3e:e0:00:0{n} dst 192.0.2.70 self permanent" in fdb, fdb
    await _still_serving(world)


def _claim(wired_at: Any, mac: str | None, ips: list[str] | None = None) -> bytes:
    body: dict[str, Any] = {"v": 1, "wired_at": wired_at}
    if mac is not None:
        body["mac"] = mac
    if ips is not None:
        body["ips"] = ips
    return json.dumps(body).encode()


# -- property: any sequence of values a node may write --------------------------------------

WIRED_AT = st.sampled_from([0, 0, 1.0, 1e9, -1, 1e300, "soon", None, True])
JUNK = st.sampled_from([
    b"", b"{", b"\xff\xfe", b"null", b"[]", b'{"v": 2}', b'{"v": 1}', b"x" * 70000,
    b'{"v": 1, "ip": "127.0.0.1"}', b'{"v": 1, "ip": "::1"}', b'{"v": 1, "ip": 5}',
])  # fmt: skip


@st.composite
def operations(draw: st.DrawFn, world: World) -> list[tuple[str, bytes | None]]:
    """A batch of writes (key, value) and deletes (key, None) under the hostile prefixes."""
    honest = world.pods
    macs = [p.mac for p in honest] + ["fa:16:3e:e0:00:00", "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01"]
    ips = [p.ip for p in honest] + ["10.77.0.200", "127.0.0.1", "224.0.0.1", "10.77.0.1"]
    ops: list[tuple[str, bytes | None]] = []
    for _ in range(draw(st.integers(1, 8))):
        host = draw(st.sampled_from(world.hostile))
        kind = draw(st.sampled_from(["claim", "claim", "claim", "vtep", "alive", "other"]))
        if kind == "claim":
            port_id = draw(st.sampled_from([
                *world.bound[world.hostile[0]], *world.bound[world.hostile[1]],
                str(uuid.uuid4()), "a" * 64,
            ]))  # fmt: skip
            key = keys.state_port(host, port_id)
            value = draw(st.one_of(
                st.builds(_claim, WIRED_AT, st.none() | st.sampled_from(macs),
                          st.none() | st.lists(st.sampled_from(ips), max_size=3)),
                JUNK,
            ))  # fmt: skip
        elif kind == "vtep":
            key = keys.state_vtep(host)
            vteps = [a.vtep for a in world.agents] + ["192.0.2.70", "0.0.0.0", "10.77.0.2"]
            value = draw(st.sampled_from(vteps).map(values.vtep_value) | JUNK)
        elif kind == "alive":
            key, value = keys.state_alive(host), draw(st.just(values.alive_value(0, "t")) | JUNK)
        else:
            name = draw(st.sampled_from(["capabilities", "memif", "policy", "physnets/x", "zz"]))
            key, value = keys.state_node_prefix(host) + name, draw(JUNK)
        ops.append((key, None if draw(st.integers(0, 5)) == 0 else value))
    return ops


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_no_sequence_of_a_nodes_values_stops_an_agent(world: World, data: Any) -> None:
    for key, value in data.draw(operations(world)):
        if value is None:
            await world.etcd.delete(key)
        else:
            await world.etcd.put(key, value)
    marker = keys.state_node_prefix(world.hostile[0]) + "marker"  # no reader's: a fence
    await _seen(world, await world.etcd.put(marker, b""))
    await _still_serving(world)


async def test_an_agent_restarted_among_hostile_values_comes_up_and_serves(
    world: World,
) -> None:
    """Tied, lying, malformed and flooding values in place when an agent starts."""
    host, other = world.hostile
    writes = [(keys.state_port(host, p), _claim(0, None)) for p in world.bound[host]]
    writes += [(keys.state_port(host, world.bound[other][0]), _claim(0, None))]  # not its own
    writes += [(keys.state_port(other, str(uuid.uuid4())), _claim(0, world.pods[0].mac))]
    writes += [(keys.state_port(other, str(uuid.uuid4())), b"\xff") for _ in range(50)]
    writes += [(keys.state_vtep(other), values.vtep_value(world.agents[0].vtep))]
    for key, value in writes:
        await world.etcd.put(key, value)
    restarted = world.agents[0]
    await restarted.stop()
    await restarted.start()
    assert restarted.agent is not None and restarted.agent.parts.peers is not None
    await eventually(_view_in(restarted), "the restarted agent's first view of its peers")
    await _still_serving(world)


def _view_in(agent: HostAgent) -> Any:
    async def known() -> bool:
        assert agent.agent is not None and agent.agent.parts.peers is not None
        return agent.agent.parts.peers.view is not None

    return known


async def test_a_lease_kept_alive_by_another_node_does_not_keep_a_dead_node_flooded(
    world: World,
) -> None:
    """#39: etcd lets any user refresh any lease, so a node could keep a dead node's heartbeat
    key alive; the beat in its value, which only that node's user writes, goes stale and the
    node leaves every flood list while its key is still there."""
    host, ttl = world.hostile[1], 2
    lease = await world.etcd.grant_lease(60)  # the "other node" keeps this one alive
    device = naming.vxlan(world.network)
    beat = values.alive_value(0, "t", time.time(), ttl)
    await world.etcd.put(keys.state_alive(host), beat, lease=lease.id)

    def flooded(agent: HostAgent) -> bool:
        fdb = in_ns(agent.netns, "bridge", "fdb", "show", "dev", device).stdout
        return "00:00:00:00:00:00 dst 192.0.2.71 self permanent" in fdb

    async def everywhere() -> bool:
        return all(flooded(agent) for agent in world.agents)

    async def nowhere() -> bool:
        return not any(flooded(agent) for agent in world.agents)

    try:
        await eventually(everywhere, "the beating node in both flood lists", timeout=10)
        await eventually(nowhere, "the node whose beat went stale out of them", timeout=15)
        assert await world.etcd.get(keys.state_alive(host)) is not None
        fresh = values.alive_value(0, "t", time.time(), ttl)
        await world.etcd.put(keys.state_alive(host), fresh, lease=lease.id)
        await eventually(everywhere, "back once it beats again", timeout=10)
    finally:
        await lease.revoke()
