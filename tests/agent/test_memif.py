"""memif end to end: a CNF (DPDK testpmd, the real memif client) behind the agent's master.

Host 1 runs an agent with the embedded device plugin (a protocol-faithful kubelet peer hands
out the grant); host 2 a plain agent with a veth pod. The veth pod pings the CNF's memif
address through VXLAN; the CNF restarts, the agent restarts; DEL and a released grant leave
nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.config import EtcdSettings
from podwire.deviceplugin.model import PodName
from podwire.etcd import EtcdClient
from podwire.memif import build as memif_build
from podwire.memif.master import PortStats, is_running
from podwire.schema import nodes
from podwire.schema.checkpoints import MemifEntry, memif_entry
from tests import testpmd
from tests.agent.conftest import two_agents
from tests.agent.harness import HostAgent, acni, plugin_binary
from tests.agent.netenv import NetEnv, in_ns, links_in, ping_settles, pings
from tests.deviceplugin.conftest import make_settings
from tests.kubelet_peer import KubeletPeer, allocate_request
from tests.testpmd import Testpmd

pytestmark = [
    pytest.mark.stack,
    pytest.mark.skipif(not testpmd.available(), reason="dpdk-testpmd (Debian dpdk-dev) missing"),
    pytest.mark.skipif(memif_build.find() is None, reason="podwire-memif not built"),
]


@dataclass
class Pod:
    name: str
    ns: str
    cid: str
    result: dict[str, Any]


@dataclass
class Grant:
    socket: str
    secret: str
    host_dir: str


@dataclass
class MemifHosts:
    kubelet: KubeletPeer
    cnf_host: HostAgent
    veth_host: HostAgent
    root: Path


@pytest.fixture
async def hosts(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
) -> AsyncIterator[MemifHosts]:
    args = (netenv, hostnames, etcd_settings, neutron_endpoint, tmp_path)
    async with _memif_hosts(*args, security_groups="off") as running:
        yield running


@pytest.fixture
async def enforcing_hosts(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
) -> AsyncIterator[MemifHosts]:
    args = (netenv, hostnames, etcd_settings, neutron_endpoint, tmp_path)
    async with _memif_hosts(*args, security_groups="enforce") as running:
        yield running


@contextlib.asynccontextmanager
async def _memif_hosts(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
    security_groups: str,
) -> AsyncIterator[MemifHosts]:
    root = Path(tempfile.mkdtemp(prefix="pw-mf-", dir="/tmp"))  # unix socket length
    kubelet = KubeletPeer(root, "podwire.io/memif")
    await kubelet.start()
    await kubelet.start_pod_resources()
    args = (netenv, hostnames, etcd_settings, neutron_endpoint, tmp_path, security_groups)

    def extra(index: int) -> dict[str, Any]:  # the device plugin on the first host only
        return {"deviceplugin": make_settings(root, devices=4)} if index == 1 else {}

    try:
        async with two_agents(*args, extra) as agents:
            await kubelet.register_events.get()
            yield MemifHosts(kubelet, agents[0], agents[1], root)
    finally:
        _kill_masters(tmp_path)
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def _kill_masters(state_root: Path) -> None:
    """A failed test may leave masters (they outlive agents by design): end them by pid."""
    for path in state_root.glob("*-state/memif-attachments.json"):
        for key, raw in json.loads(path.read_text())["memifs"].items():
            entry = memif_entry(key, raw)
            if is_running(entry.pid, entry.started):
                os.kill(entry.pid, 9)


async def _grant(hosts: MemifHosts, pod: str, device: str) -> Grant:
    response = await hosts.kubelet.stub.Allocate(allocate_request([device]))
    container = response.container_responses[0]
    hosts.kubelet.pods[PodName("default", pod)] = [device]
    return Grant(
        container.envs["MEMIF_SOCKET"].replace("/run/vpp", container.mounts[0].host_path),
        container.envs["MEMIF_SECRET"],
        container.mounts[0].host_path,
    )


async def _add(agent: HostAgent, netenv: NetEnv, network: str, name: str, **conf: Any) -> Pod:
    ns = netenv.namespace(name)
    cid = uuid.uuid4().hex
    args = f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};K8S_POD_UID={uuid.uuid4()}"
    call = await acni(
        _plugin(),
        "ADD",
        agent.conf(network, **conf),
        container_id=cid,
        netns=f"/run/netns/{ns}",
        args=args,
    )
    assert call.code == 0, call.stdout
    return Pod(name, ns, cid, call.json)


def _plugin() -> Path:
    return plugin_binary("c", Path(tempfile.gettempdir()))


async def _del(agent: HostAgent, network: str, pod: Pod) -> None:
    call = await acni(
        _plugin(),
        "DEL",
        agent.conf(network),
        container_id=pod.cid,
        netns=f"/run/netns/{pod.ns}",
    )
    assert call.code == 0, call.stdout


def _memif_ip(result: dict[str, Any]) -> str:
    index = next(i for i, item in enumerate(result["interfaces"]) if item["name"] == "memif0")
    return next(ip["address"] for ip in result["ips"] if ip["interface"] == index).split("/")[0]


def _entry(agent: HostAgent, attachment: str) -> MemifEntry:
    assert agent.agent is not None and agent.agent.parts.memif is not None
    entry = agent.agent.parts.memif.get(attachment)
    assert entry is not None
    return entry


async def test_memif_cnf_pinged_across_hosts_restarts_and_teardown(
    hosts: MemifHosts, netenv: NetEnv, vxnet: Any, neutron: Any, etcd: EtcdClient, tmp_path: Path
) -> None:
    raw = await etcd.get(keys.state_capabilities(hosts.cnf_host.host))
    assert raw is not None and "memif" in nodes.parse_capabilities(raw.value).vif_types
    raw = await etcd.get(keys.state_capabilities(hosts.veth_host.host))
    assert raw is not None and "memif" not in nodes.parse_capabilities(raw.value).vif_types

    grant = await _grant(hosts, "cnf", "memif-0")
    cnf = await _add(hosts.cnf_host, netenv, vxnet.id, "cnf")
    memif_iface = cnf.result["interfaces"][-1]
    assert memif_iface["name"] == "memif0" and memif_iface["socketPath"] == grant.socket
    info = json.loads((Path(grant.host_dir) / "memif.json").read_text())
    assert info["mac"] == memif_iface["mac"] and info["gateway"] == "10.77.0.1"
    assert info["ips"][0].split("/")[0] == _memif_ip(cnf.result)
    assert Path(grant.socket).is_socket()
    client = await _add(hosts.veth_host, netenv, vxnet.id, "client")
    assert all(i["name"] != "memif0" for i in client.result["interfaces"])  # no grant: veth only
    # The memif port is a port like eth0's: same network, same security groups.
    by_mac = {p.mac_address: p for p in neutron.network.ports(network_id=vxnet.id)}
    eth0 = by_mac[cnf.result["interfaces"][1]["mac"]]
    memif_port = by_mac[memif_iface["mac"]]
    assert memif_port.id != eth0.id
    assert sorted(memif_port.security_group_ids) == sorted(eth0.security_group_ids)

    target = _memif_ip(cnf.result)
    cnf_pmd = Testpmd.memif_client(grant.socket, grant.secret, info["mac"], log=tmp_path / "tp1")
    try:
        cnf_pmd.start()
        assert await ping_settles(client.ns, target, within=15.0), (tmp_path / "tp1").read_text()
        # Unfiltered, the CNF answers for an address it does not own (icmpecho answers any);
        # test_security_groups_apply_to_the_memif_port sees that dropped.
        assert await asyncio.to_thread(pings, client.ns, _unused_address(neutron, vxnet), 2.0)

        # CNF restart: a new client on the same socket, no new ADD.
        cnf_pmd.stop()
        cnf_pmd.start()
        assert await ping_settles(client.ns, target, within=15.0), (
            "no answer after the CNF restarted"
        )

        # Agent restart: the master outlives it and is adopted, traffic goes on.
        before = _entry(hosts.cnf_host, f"{cnf.cid}:eth0")
        await hosts.cnf_host.stop()
        assert await asyncio.to_thread(pings, client.ns, target, 3.0)
        await hosts.cnf_host.start()
        after = _entry(hosts.cnf_host, f"{cnf.cid}:eth0")
        assert (after.pid, after.started) == (before.pid, before.started)
        assert await asyncio.to_thread(pings, client.ns, target, 3.0)
    finally:
        cnf_pmd.stop()

    entry = _entry(hosts.cnf_host, f"{cnf.cid}:eth0")
    await _del(hosts.cnf_host, vxnet.id, cnf)
    assert not is_running(entry.pid, entry.started)
    assert not Path(grant.socket).exists()
    assert not (Path(grant.host_dir) / "memif.json").exists()
    assert entry.tap not in links_in(hosts.cnf_host.netns)
    assert neutron.network.find_port(entry.vif.port_id) is None
    assert await etcd.get(keys.state_port(hosts.cnf_host.host, entry.vif.port_id)) is None
    await _del(hosts.veth_host, vxnet.id, client)


async def test_two_memif_pods_and_grant_release(
    hosts: MemifHosts, netenv: NetEnv, vxnet: Any, neutron: Any, etcd: EtcdClient, tmp_path: Path
) -> None:
    grants = [await _grant(hosts, f"cnf{i}", f"memif-{i}") for i in range(2)]
    pods = [await _add(hosts.cnf_host, netenv, vxnet.id, f"cnf{i}") for i in range(2)]
    client = await _add(hosts.veth_host, netenv, vxnet.id, "client")
    entries = [_entry(hosts.cnf_host, f"{pod.cid}:eth0") for pod in pods]
    assert len({e.tap for e in entries}) == 2 and len({e.vif.port_id for e in entries}) == 2
    pmds = [
        Testpmd.memif_client(g.socket, g.secret, e.vif.mac_address, log=tmp_path / f"tp{i}")
        for i, (g, e) in enumerate(zip(grants, entries, strict=True))
    ]
    try:
        for pmd in pmds:
            pmd.start()
        for pod in pods:
            assert await ping_settles(client.ns, _memif_ip(pod.result), within=15.0)
    finally:
        for pmd in pmds:
            pmd.stop()

    # kubelet released the first grant (its dir goes, as the device plugin removes it).
    shutil.rmtree(grants[0].host_dir)
    gone = entries[0]
    async with asyncio.timeout(10):
        while _memif_of(hosts.cnf_host, f"{pods[0].cid}:eth0") is not None:
            await asyncio.sleep(0.1)
    assert gone.tap not in _served(hosts.cnf_host)
    assert gone.tap not in links_in(hosts.cnf_host.netns)
    assert neutron.network.find_port(gone.vif.port_id) is None
    state_key = keys.state_port(hosts.cnf_host.host, gone.vif.port_id)
    async with asyncio.timeout(10):
        while await etcd.get(state_key) is not None:
            await asyncio.sleep(0.1)
    assert not Path(gone.socket).exists()
    assert _served(hosts.cnf_host)[entries[1].tap].connects == 1  # the other pod is untouched
    for pod in pods:
        await _del(hosts.cnf_host, vxnet.id, pod)
    await _del(hosts.veth_host, vxnet.id, client)
    assert not is_running(entries[1].pid, entries[1].started)  # no memif left: no master
    assert not [name for name in links_in(hosts.cnf_host.netns) if name.startswith("pwt")]


async def test_device_plugin_failure_never_stops_veth_pods(
    hosts: MemifHosts, netenv: NetEnv, vxnet: Any
) -> None:
    plain = await _add(hosts.cnf_host, netenv, vxnet.id, "plain")  # no grant: veth only
    assert [i["name"] for i in plain.result["interfaces"]][-1] == "eth0"
    # A grant kubelet has not tied to a pod yet, and kubelet's PodResources API down: the
    # agent cannot tell whose grant it is, and the ADD goes on without memif.
    await hosts.kubelet.stub.Allocate(allocate_request(["memif-3"]))
    await hosts.kubelet.stop_pod_resources()
    other = await _add(hosts.cnf_host, netenv, vxnet.id, "other")
    assert all(i["name"] != "memif0" for i in other.result["interfaces"])
    for pod in (plain, other):
        await _del(hosts.cnf_host, vxnet.id, pod)


def _served(agent: HostAgent) -> dict[str, PortStats]:
    """The ports the node's master serves, as its control socket lists them."""
    assert agent.agent is not None and agent.agent.parts.memif is not None
    return agent.agent.parts.memif.served()


def _memif_of(agent: HostAgent, attachment: str) -> MemifEntry | None:
    assert agent.agent is not None and agent.agent.parts.memif is not None
    return agent.agent.parts.memif.get(attachment)


@pytest.fixture
def cnf_groups(neutron: Any, project_id: str) -> Iterator[tuple[Any, Any]]:
    """The CNF's group (no ingress rule: Neutron gives it its egress ones) and the client's."""
    net = neutron.network
    made = [net.create_security_group(name=f"pw-mf-{n}", project_id=project_id) for n in "ab"]
    yield made[0], made[1]
    for port in list(net.ports(project_id=project_id)):
        net.delete_port(port)
    for group in made:
        net.delete_security_group(group)


def _unused_address(neutron: Any, network: Any) -> str:
    used = {ip["ip_address"] for p in neutron.network.ports(network_id=network.id)
            for ip in p.fixed_ips}  # fmt: skip
    return next(a for a in (f"10.77.0.{i}" for i in range(250, 1, -1)) if a not in used)


def _secured(agent: HostAgent) -> set[str]:
    """The host interfaces podwire's tables in the host's kernel filter."""
    out = in_ns(agent.netns, "nft", "-j", "list", "map", "bridge", "podwire", "ports").stdout
    [found] = [item["map"] for item in json.loads(out)["nftables"] if "map" in item]
    return {name for name, _ in found.get("elem", [])}


async def _eventually_denied(ns: str, address: str, within: float = 5.0) -> bool:
    """A ping id admitted before a rule went may linger in conntrack for a moment."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if not await asyncio.to_thread(pings, ns, address, 1.0):
            return True
    return False


async def test_security_groups_apply_to_the_memif_port(
    enforcing_hosts: MemifHosts,
    netenv: NetEnv,
    vxnet: Any,
    neutron: Any,
    cnf_groups: tuple[Any, Any],
    tmp_path: Path,
) -> None:
    hosts, net = enforcing_hosts, neutron.network
    cnf_group, client_group = cnf_groups
    grant = await _grant(hosts, "cnf", "memif-0")
    cnf = await _add(hosts.cnf_host, netenv, vxnet.id, "cnf", securityGroups=[cnf_group.id])
    client = await _add(hosts.veth_host, netenv, vxnet.id, "client",
                        securityGroups=[client_group.id])  # fmt: skip
    entry = _entry(hosts.cnf_host, f"{cnf.cid}:eth0")
    assert entry.tap in _secured(hosts.cnf_host)
    target = _memif_ip(cnf.result)
    pmd = Testpmd.memif_client(grant.socket, grant.secret, entry.vif.mac_address,
                               log=tmp_path / "tp")  # fmt: skip
    try:
        pmd.start()
        assert not await asyncio.to_thread(pings, client.ns, target, 3.0)  # no ingress rule
        rule = net.create_security_group_rule(
            security_group_id=cnf_group.id, direction="ingress", ethertype="IPv4", protocol="icmp"
        )
        assert await ping_settles(client.ns, target, within=15.0), (tmp_path / "tp").read_text()
        # testpmd's icmpecho answers ARP and ping for any address: from one the CNF's port
        # does not own, its answers are spoofed and dropped at the tap.
        spoofed = _unused_address(neutron, vxnet)
        assert not await asyncio.to_thread(pings, client.ns, spoofed, 1.0)

        # The master dies and is restarted: its new tap is filtered as the old one was.
        os.kill(entry.pid, 9)
        async with asyncio.timeout(10):
            while _entry(hosts.cnf_host, f"{cnf.cid}:eth0").pid == entry.pid:
                await asyncio.sleep(0.1)
        pmd.stop()
        pmd.start()
        assert await ping_settles(client.ns, target, within=15.0), (
            "no answer after the master restarted"
        )
        assert not await asyncio.to_thread(pings, client.ns, spoofed, 1.0)

        net.delete_security_group_rule(rule)
        assert await _eventually_denied(client.ns, target)
        assert not await asyncio.to_thread(pings, client.ns, target, 1.0)

        # Agent restart: the memif port is adopted from the memif checkpoint, still enforced.
        await hosts.cnf_host.stop()
        assert not await asyncio.to_thread(pings, client.ns, target, 1.0)
        await hosts.cnf_host.start()
        assert not await asyncio.to_thread(pings, client.ns, target, 2.0)
        assert entry.tap in _secured(hosts.cnf_host)
    finally:
        pmd.stop()

    await _del(hosts.cnf_host, vxnet.id, cnf)
    assert entry.tap not in _secured(hosts.cnf_host)
    await _del(hosts.veth_host, vxnet.id, client)


def _stats(agent: HostAgent, tap: str) -> PortStats:
    return _served(agent)[tap]


async def _until_path(agent: HostAgent, tap: str, path: str, within: float = 10.0) -> float:
    """Seconds until the master serves ``tap`` on ``path``."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(within):
        while _stats(agent, tap).path != path:
            await asyncio.sleep(0.005)
    return loop.time() - started


async def _shown(etcd: EtcdClient, agent: HostAgent) -> dict[str, nodes.MemifPortState]:
    """What ``podwire status`` shows of the host's memif ports, by Neutron port."""
    kv = await etcd.get(keys.state_memif(agent.host))
    return {p.port_id: p for p in nodes.parse_memif_state(kv.value)} if kv else {}


async def _until_shown(etcd: EtcdClient, agent: HostAgent, want: dict[str, str]) -> None:
    """Until each port shows the reason for its path ``want`` says."""
    async with asyncio.timeout(15):
        while {k: p.why for k, p in (await _shown(etcd, agent)).items()} != want:
            await asyncio.sleep(0.1)


async def _until_counted(agent: HostAgent, tap: str, field: str, more_than: int) -> int:
    async with asyncio.timeout(20):
        while (count := getattr(_stats(agent, tap), field)) <= more_than:
            await asyncio.sleep(0.02)
    return int(count)


async def test_security_groups_in_the_master_keep_the_shared_path(
    enforcing_hosts: MemifHosts,
    netenv: NetEnv,
    vxnet: Any,
    neutron: Any,
    cnf_groups: tuple[Any, Any],
    etcd: EtcdClient,
    tmp_path: Path,
) -> None:
    """Two CNFs' memif ports with port security on and a group without ingress rules: the
    agent hands the master their classifiers and they go ring to ring. A's UDP to B is denied
    until a rule created through Neutron admits it; A's frames from an address its port does
    not own are dropped as spoofed; with port security off the master stops classifying."""
    hosts, net = enforcing_hosts, neutron.network
    cnf_group, _ = cnf_groups
    grants = [await _grant(hosts, f"cnf{i}", f"memif-{i}") for i in range(2)]
    pods = [await _add(hosts.cnf_host, netenv, vxnet.id, f"cnf{i}",
                       securityGroups=[cnf_group.id]) for i in range(2)]  # fmt: skip
    a, b = (_entry(hosts.cnf_host, f"{pod.cid}:eth0") for pod in pods)
    ip_a, ip_b = (_memif_ip(pod.result) for pod in pods)
    in_master = "security groups in the master"
    await _until_shown(etcd, hosts.cnf_host, {a.vif.port_id: in_master, b.vif.port_id: in_master})
    assert {_stats(hosts.cnf_host, e.tap).path for e in (a, b)} == {"shared"}
    assert a.tap in _secured(hosts.cnf_host)  # its tap's frames (broadcasts) stay filtered

    mac_a, mac_b = a.vif.mac_address, b.vif.mac_address
    receiver = Testpmd.memif_client(grants[1].socket, grants[1].secret, mac_b, mode="rxonly",
                                    log=tmp_path / "rx")  # fmt: skip

    started = [receiver]

    def sender(source: str, log: str) -> Testpmd:
        pmd = Testpmd.memif_client(
            grants[0].socket, grants[0].secret, mac_a, mode="txonly", cpu=0, log=tmp_path / log,
            extra=("--txpkts=64", f"--eth-peer=0,{mac_b}", f"--tx-ip={source},{ip_b}",
                   "--tx-udp=4000,9"),
        )  # fmt: skip
        started.append(pmd)
        pmd.start()
        return pmd

    try:
        receiver.start()
        honest = sender(ip_a, "tx")
        await _until_counted(hosts.cnf_host, b.tap, "denied", 10_000)
        assert _stats(hosts.cnf_host, b.tap).to_client < 20  # B's ingress has no rule
        assert _stats(hosts.cnf_host, a.tap).to_kernel < 20  # and nothing went round it

        net.create_security_group_rule(
            security_group_id=cnf_group.id, direction="ingress", ethertype="IPv4",
            protocol="udp", port_range_min=9, port_range_max=9,
        )  # fmt: skip
        got = await _until_counted(hosts.cnf_host, b.tap, "to_client", 10_000)
        denied = _stats(hosts.cnf_host, b.tap).denied  # the rule is in force from here on
        await _until_counted(hosts.cnf_host, b.tap, "to_client", got + 10_000)
        assert _stats(hosts.cnf_host, b.tap).denied == denied
        a_now = _stats(hosts.cnf_host, a.tap)
        assert a_now.to_shared >= 20_000 and a_now.admitted >= 20_000
        honest.stop()

        forger = sender(_unused_address(neutron, vxnet), "tx-forged")
        got = _stats(hosts.cnf_host, b.tap).to_client
        await _until_counted(hosts.cnf_host, a.tap, "spoofed", 10_000)
        assert _stats(hosts.cnf_host, b.tap).to_client - got < 20
        forger.stop()

        for entry in (a, b):
            net.update_port(entry.vif.port_id, security_groups=[], port_security_enabled=False)
        off = "port security off"
        await _until_shown(etcd, hosts.cnf_host, {a.vif.port_id: off, b.vif.port_id: off})
        sender(_unused_address(neutron, vxnet), "tx-forged-2")
        got = _stats(hosts.cnf_host, b.tap).to_client
        await _until_counted(hosts.cnf_host, b.tap, "to_client", got + 10_000)
        assert _stats(hosts.cnf_host, a.tap).path == "shared"
    finally:
        for pmd in started:
            pmd.stop()
    for pod in pods:
        await _del(hosts.cnf_host, vxnet.id, pod)
