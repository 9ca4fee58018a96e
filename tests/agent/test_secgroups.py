"""Security groups and port security enforced by real agents on two simulated hosts.

Ports come from the stack's real Neutron (created with the test's own group); until the ml2
forwarder publishes groups, the group, its rules and the remote-group members are written into
etcd here with the schema's encoders, exactly as the forwarder will write them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.config import EtcdSettings
from podwire.controller.app import Controller
from podwire.etcd import EtcdClient
from podwire.schema import nodes
from podwire.schema.inuse import PoolKey
from tests.agent.harness import HostAgent, acni, plugin_binary
from tests.agent.netenv import NetEnv, in_ns, pings
from tests.agent.test_with_controller import controller_and_agent
from tests.controller.conftest import Node, admin, pooled_ports

pytestmark = pytest.mark.stack

ECHO = str(Path(__file__).with_name("echopeer.py"))


@dataclass
class Pod:
    agent: HostAgent
    ns: str
    cid: str
    ip: str


def _rule(net: Any, sg: str, **body: Any) -> Any:
    return net.create_security_group_rule(
        security_group_id=sg, direction="ingress", ethertype="IPv4", **body
    )


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    """The C plugin only: both builds are the same pipe, covered by the CNI tests."""
    return plugin_binary("c", tmp_path)


@pytest.fixture
def groups(neutron: Any, project_id: str) -> Iterator[list[Any]]:
    """Two Neutron groups of this test's project (Neutron gives each its egress rules)."""
    net = neutron.network
    made = [net.create_security_group(name=f"pw-sg{i}", project_id=project_id) for i in (1, 2)]
    yield made
    for port in list(net.ports(project_id=project_id)):
        net.delete_port(port)
    for group in made:
        net.delete_security_group(group)


async def _add(plugin: Path, agent: HostAgent, netenv: NetEnv, net: str, sg: str, name: str) -> Pod:
    ns = netenv.namespace(name)
    cid = uuid.uuid4().hex
    call = await acni(
        plugin,
        "ADD",
        agent.conf(net, securityGroups=[sg]),
        container_id=cid,
        netns=f"/run/netns/{ns}",
    )
    assert call.code == 0, call.stdout
    return Pod(agent, ns, cid, call.json["ips"][0]["address"].split("/")[0])


def _serve(pod: Pod, port: int) -> subprocess.Popen[str]:
    argv = ["ip", "netns", "exec", pod.ns, sys.executable, ECHO, "serve", "tcp", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    return proc


def _client(pod: Pod, ip: str, port: int) -> subprocess.Popen[str]:
    argv = ["ip", "netns", "exec", pod.ns, sys.executable, ECHO, "client", "tcp", ip, str(port)]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _connects(pod: Pod, ip: str, port: int) -> bool:
    proc = _client(pod, ip, port)
    out, _ = proc.communicate("hello\n", timeout=10)
    return out.splitlines()[:2] == ["connected", "hello"]


def _talk(proc: subprocess.Popen[str], line: str) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


async def _eventually(check: Any, expected: bool, within: float = 5.0) -> bool:
    """Rule changes apply in milliseconds; conntrack may still carry a ping id for a moment."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = await asyncio.to_thread(check)
        if result == expected or loop.time() > deadline:
            return bool(result)
        await asyncio.sleep(0.2)


async def test_remote_group_spoofing_and_restart_with_live_flows(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    etcd: EtcdClient,
    groups: list[Any],
    project_id: str,
) -> None:
    h1, h2 = enforcing_agents
    web, other = groups
    net = neutron.network
    _rule(net, web.id, protocol="icmp", remote_group_id=web.id)  # ping from members only
    _rule(
        net,
        web.id,
        protocol="tcp",
        port_range_min=5001,
        port_range_max=5001,
        remote_ip_prefix="10.77.0.0/24",
    )
    a = await _add(plugin, h1, netenv, vxnet.id, web.id, "pa")
    b = await _add(plugin, h2, netenv, vxnet.id, web.id, "pb")
    c = await _add(plugin, h1, netenv, vxnet.id, other.id, "pc")
    servers = [_serve(b, 5001), _serve(b, 5002)]
    try:
        # by remote group: a and b are members, c is not
        assert await _eventually(lambda: pings(a.ns, b.ip, 1.0), True)
        assert not pings(c.ns, b.ip, 1.0)
        # by rule and prefix across hosts; replies pass (b's egress rules are Neutron's own)
        assert _connects(c, b.ip, 5001) and not _connects(a, b.ip, 5002)
        # a leaves the group in Neutron: no longer a member, no longer admitted
        [port_a] = [
            p
            for p in net.ports(project_id=project_id)
            if any(ip["ip_address"] == a.ip for ip in p.fixed_ips)
        ]
        net.update_port(port_a, security_groups=[other.id])
        assert not await _eventually(lambda: pings(a.ns, b.ip, 1.0), False)
        net.update_port(port_a, security_groups=[web.id])
        assert await _eventually(lambda: pings(a.ns, b.ip, 1.0), True)
        # a spoofed source IP is dropped at the sender's bridge port
        in_ns(a.ns, "ip", "addr", "add", "10.77.0.250/24", "dev", "eth0")
        spoofed = in_ns(a.ns, "ping", "-c1", "-W1", "-I", "10.77.0.250", b.ip, check=False)
        assert spoofed.returncode != 0
        # a flow across an agent restart keeps working; a denied one stays denied
        flow = _client(a, b.ip, 5001)
        assert _talk(flow, "before") == "connected" and _talk(flow, "x") == "before"
        await h2.stop()
        assert not _connects(a, b.ip, 5002)
        await h2.start()
        assert _talk(flow, "after") == "x"  # each answer is the echo of the line before
        assert not _connects(a, b.ip, 5002)
        if flow.stdin:
            flow.stdin.close()
        flow.wait(5)
        state = None
        for _ in range(25):
            state = await etcd.get(keys.state_policy(h2.host))
            if state is not None:
                break
            await asyncio.sleep(0.2)
        assert state is not None and nodes.parse_policy_state(state.value).enforced_ports == 1
    finally:
        for proc in servers:
            proc.kill()
            proc.wait()


@pytest.fixture
async def pooled_sg(
    stack: dict[str, Any],
    etcd: EtcdClient,
    etcd_settings: EtcdSettings,
    netenv: NetEnv,
    hostnames: list[str],
    neutron_endpoint: str,
    tmp_path: Path,
) -> AsyncIterator[tuple[Controller, HostAgent, Node]]:
    """A controller in this loop and one enforcing agent that gets its VIFs from it."""
    args = (stack, etcd, etcd_settings, netenv, hostnames, neutron_endpoint, tmp_path)
    async with controller_and_agent(*args, security_groups="enforce") as running:
        yield running


async def test_pooled_port_moved_to_other_groups_is_filtered_by_the_new_ones(
    pooled_sg: tuple[Controller, HostAgent, Node],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    groups: list[Any],
    project_id: str,
) -> None:
    controller, agent, node = pooled_sg
    closed, web = groups  # closed: Neutron's egress rules only; web admits TCP 5001
    _rule(neutron.network, web.id, protocol="tcp", port_range_min=5001, port_range_max=5001)
    async with aiohttp.ClientSession() as http:
        status, _ = await admin(
            http,
            "POST",
            f"http://127.0.0.1:{controller.port}/v1/pools/populate",
            {
                "nodes": [node.name],
                "network": vxnet.id,
                "security_groups": [closed.id],
                "count": 1,
            },
        )
        assert status == 200
    key = PoolKey(node.name, project_id, vxnet.id)
    [pooled_id] = pooled_ports(controller, key)
    subject = await _add(plugin, agent, netenv, vxnet.id, web.id, "subj")
    assert pooled_ports(controller, key) == set()  # the ADD took the pooled port ...
    port = neutron.network.get_port(pooled_id)
    assert port.security_group_ids == [web.id]  # ... and moved it to the web group
    peer = await _add(plugin, agent, netenv, vxnet.id, web.id, "peer")
    server = _serve(subject, 5001)
    try:
        assert _connects(peer, subject.ip, 5001)  # web's rule, not closed's deny
    finally:
        server.kill()
        server.wait()


async def test_neutron_rules_and_members_are_enforced_end_to_end(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
) -> None:
    h1, h2 = enforcing_agents
    net = neutron.network
    web = net.create_security_group(name="pw-web", project_id=project_id)
    other = net.create_security_group(name="pw-other", project_id=project_id)
    try:
        net.create_security_group_rule(
            security_group_id=web.id,
            direction="ingress",
            ethertype="IPv4",
            protocol="tcp",
            port_range_min=5001,
            port_range_max=5001,
            remote_group_id=web.id,
        )
        a = await _add(plugin, h1, netenv, vxnet.id, web.id, "na")
        b = await _add(plugin, h2, netenv, vxnet.id, web.id, "nb")
        c = await _add(plugin, h1, netenv, vxnet.id, other.id, "nc")
        servers = [_serve(b, 5001), _serve(b, 5002)]
        try:
            # by remote group, as Neutron's membership says; Neutron's default egress rules
            assert await _eventually(lambda: _connects(a, b.ip, 5001), True)
            assert not _connects(c, b.ip, 5001)
            # a rule created and deleted through the Neutron API
            rule = net.create_security_group_rule(
                security_group_id=web.id,
                direction="ingress",
                ethertype="IPv4",
                protocol="tcp",
                port_range_min=5002,
                port_range_max=5002,
                remote_ip_prefix="10.77.0.0/24",
            )
            assert await _eventually(lambda: _connects(c, b.ip, 5002), True)
            net.delete_security_group_rule(rule)
            assert not await _eventually(lambda: _connects(c, b.ip, 5002), False)
            # c's port joins the group: a member now, admitted
            [port] = list(net.ports(project_id=project_id, security_group_ids=[other.id]))
            net.update_port(port, security_groups=[other.id, web.id])
            assert await _eventually(lambda: _connects(c, b.ip, 5001), True)
        finally:
            for proc in servers:
                proc.kill()
                proc.wait()
    finally:
        for port in list(net.ports(project_id=project_id)):
            net.delete_port(port)
        for group in (web, other):
            net.delete_security_group(group)


async def test_tables_changed_behind_the_agent_are_repaired_and_counted(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
) -> None:
    """#39 drift: podwire's tables flushed or a rule deleted by hand let through what the
    groups deny, until the agent's read-back finds the change and puts the ruleset back."""
    h1, h2 = enforcing_agents
    net = neutron.network
    web = net.create_security_group(name="pw-drift", project_id=project_id)
    try:
        a = await _add(plugin, h1, netenv, vxnet.id, web.id, "da")
        b = await _add(plugin, h2, netenv, vxnet.id, web.id, "db")
        server = _serve(b, 5003)  # no rule admits 5003
        try:
            assert not await _eventually(lambda: _connects(a, b.ip, 5003), False)
            assert h2.agent is not None
            repairs = h2.agent.metrics.registry.get_sample_value
            for tamper in (("flush", "table", "inet", "podwire"),
                           ("delete", "table", "inet", "podwire")):  # fmt: skip
                before = repairs("podwire_agent_policy_repairs_total") or 0
                in_ns(h2.netns, "nft", *tamper)
                # Open for a moment (without the read-back, for good), then closed again.
                assert not await _eventually(lambda: _connects(a, b.ip, 5003), False, within=10)
                assert (repairs("podwire_agent_policy_repairs_total") or 0) == before + 1
                tables = in_ns(h2.netns, "nft", "list", "table", "inet", "podwire").stdout
                assert "chain" in tables, tables
        finally:
            server.kill()
            server.wait()
    finally:
        for port in list(net.ports(project_id=project_id)):
            net.delete_port(port)
        net.delete_security_group(web)


# The test's own tables around podwire's: a foreign bit (kube-proxy's masquerade mark) set
# before podwire's hooks, then counted after them, with any podwire bit left over.
FOREIGN_MARKS = """
table bridge pwtest_marks {
    chain pre { type filter hook prerouting priority -300; meta mark set meta mark | 0x4000; }
}
table inet pwtest_marks {
    counter kept {}
    counter leftover {}
    chain after_podwire {
        type filter hook forward priority 0;
        meta mark & 0x4000 == 0x4000 counter name kept
        meta mark & 0x0fff0fff != 0 counter name leftover
    }
}
"""


def _counter(ns: str, name: str) -> int:
    listed = in_ns(ns, "nft", "-j", "list", "counter", "inet", "pwtest_marks", name).stdout
    found = json.loads(listed)["nftables"]
    return int(next(item["counter"]["packets"] for item in found if "counter" in item))


async def test_the_mark_bits_not_podwires_pass_through_and_its_own_are_cleared(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    groups: list[Any],
    neutron: Any,
    tmp_path: Path,
) -> None:
    """Another user of the mark (kube-proxy marks Service traffic to masquerade) keeps its
    bits across podwire's marking and filtering, which sees only its own bits: policy is
    enforced as without them, and podwire's bits are gone once its verdict is given."""
    h1, _ = enforcing_agents
    web, other = groups
    _rule(neutron.network, web.id, protocol="icmp", remote_group_id=web.id)
    a = await _add(plugin, h1, netenv, vxnet.id, web.id, "ma")
    b = await _add(plugin, h1, netenv, vxnet.id, web.id, "mb")
    c = await _add(plugin, h1, netenv, vxnet.id, other.id, "mc")
    tables = tmp_path / "marks.nft"
    tables.write_text(FOREIGN_MARKS)
    in_ns(h1.netns, "nft", "-f", str(tables))
    try:
        assert await _eventually(lambda: pings(a.ns, b.ip, 1.0), True)
        assert not pings(c.ns, b.ip, 1.0)  # b's group admits members only, marked or not
        assert _counter(h1.netns, "kept") > 0
        assert _counter(h1.netns, "leftover") == 0
    finally:
        for family in ("bridge", "inet"):
            in_ns(h1.netns, "nft", "delete", "table", family, "pwtest_marks", check=False)
