"""VXLAN without learning, against a node that lies: real agents on two simulated hosts and a
third "node" scripted by the test, whose kernel sends real VXLAN frames onto the underlay.

The hostile node registers like an agent (alive, VTEP) and claims a pod of host 1 as its own
port, then sends frames with that pod's MAC and address. The two honest agents forward to
each remote MAC from the wired-port state its own host published, learn nothing from frames,
answer ARP for known addresses locally, and drop frames from other nodes whose source MAC is
no port of theirs.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.agent import naming
from podwire.etcd import EtcdClient
from podwire.schema import nodes as values
from podwire.schema.ports import parse_desired_port
from tests.agent.desired_keys import desired_value
from tests.agent.harness import HostAgent, cni_pod
from tests.agent.netenv import NetEnv, in_ns, ping_settles
from tests.etcd_tools import delete_prefix
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack

HOSTILE_VTEPS = ["127.0.0.1", "169.254.7.7", "224.0.0.9", "255.255.255.255", "0.0.0.0"]


@pytest.fixture
def open_group(neutron: Any, project_id: str) -> Any:
    net = neutron.network
    group = net.create_security_group(name="pw-l2pop", project_id=project_id)
    net.create_security_group_rule(
        security_group_id=group.id, direction="ingress", ethertype="IPv4", protocol="icmp"
    )
    yield group
    for port in list(net.ports(project_id=project_id)):
        net.delete_port(port)
    net.delete_security_group(group)


def _hostile_node(netenv: NetEnv, vni: int, honest: list[str]) -> tuple[str, str]:
    """Host 3 of the underlay with a VXLAN device of the network, flooding to both honest
    VTEPs, and a namespace behind it; returns (that namespace, host 3's VTEP)."""
    ns, vtep = netenv.host(3)
    in_ns(ns, "ip", "link", "add", "br0", "type", "bridge")
    in_ns(ns, "ip", "link", "add", "vx0", "type", "vxlan", "id", str(vni), "local", vtep,
          "dstport", "4789", "nolearning")  # fmt: skip
    for peer in honest:
        in_ns(ns, "bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "vx0", "dst", peer)
    guest = netenv.namespace("evil")
    in_ns(ns, "ip", "link", "add", "e0", "type", "veth", "peer", "eth0", "netns", guest)
    for link in ("vx0", "e0"):
        in_ns(ns, "ip", "link", "set", link, "master", "br0", "up")
    in_ns(ns, "ip", "link", "set", "br0", "up")
    return guest, vtep


async def _register(etcd: EtcdClient, host: str, vtep: str, lease: int) -> None:
    await etcd.put(keys.state_vtep(host), values.vtep_value(vtep))
    await etcd.put(keys.state_alive(host), values.alive_value(0, "t"), lease=lease)


def _fdb(agent: HostAgent, device: str) -> str:
    return in_ns(agent.netns, "bridge", "fdb", "show", "dev", device).stdout


async def test_a_lying_node_cannot_take_a_pods_traffic(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    neutron: Any,
    open_group: Any,
    etcd: EtcdClient,
    tmp_path: Path,
) -> None:
    h1, h2 = enforcing_agents
    victim = await cni_pod(h1, netenv, vxnet.id, open_group.id, tmp_path)
    client = await cni_pod(h2, netenv, vxnet.id, open_group.id, tmp_path)
    assert await ping_settles(client["ns"], victim["ip"])
    assert await ping_settles(victim["ns"], client["ip"])
    # Host 2 knew the victim before its own pod joined the bridge: the bridge's fixed address
    # did not change with that pod, so the answer for the victim was not flushed with it.
    bridge = naming.bridge(vxnet.id)
    neighbours = in_ns(h2.netns, "ip", "neigh", "show", "dev", bridge).stdout
    assert f"{victim['ip']} lladdr {victim['mac']} PERMANENT" in neighbours
    assert naming.bridge_mac(bridge) in in_ns(h2.netns, "ip", "link", "show", bridge).stdout
    device = naming.vxlan(vxnet.id)
    vni = int(neutron.network.get_network(vxnet.id).provider_segmentation_id)
    evil_ns, evil_vtep = _hostile_node(netenv, vni, [h1.vtep, h2.vtep])
    lease = await etcd.grant_lease(60)
    liars = [f"{netenv.tag}-evil{i}" for i in range(len(HOSTILE_VTEPS) + 1)]
    try:
        await _register(etcd, liars[0], evil_vtep, lease.id)
        for liar, vtep in zip(liars[1:], HOSTILE_VTEPS, strict=True):
            await _register(etcd, liar, vtep, lease.id)
        claim = parse_desired_port(
            desired_value(str(uuid.uuid4()), vxnet.id, victim["mac"], [_fixed(victim["ip"])])
        )  # the victim's MAC and address, as the liar's own port, claimed now
        await etcd.put(keys.state_port(liars[0], claim.port_id),
                       values.port_state_value(time.time(), claim))  # fmt: skip

        async def flooded() -> bool:
            return all(f"dst {evil_vtep}" in _fdb(agent, device) for agent in (h1, h2))

        # Both hosts have taken in host 3's claims by now: the victim's own host among them.
        await eventually(flooded, "host 3 in the flood lists (a live node)", timeout=15)
        assert victim["mac"] not in _fdb(h1, device)  # its own pod's MAC: no node's claim
        for agent in (h1, h2):
            entries = [
                line for line in _fdb(agent, device).splitlines() if "00:00:00:00:00:00" in line
            ]
            assert not [e for e in entries if any(f"dst {bad} " in e for bad in HOSTILE_VTEPS)]
            assert len(entries) == 2, entries  # the other honest node and host 3

        # The liar sends as the victim: gratuitous ARP and pings from its MAC and address.
        in_ns(evil_ns, "ip", "link", "set", "eth0", "address", victim["mac"], "up")
        in_ns(evil_ns, "ip", "addr", "add", f"{victim['ip']}/24", "dev", "eth0")
        for _ in range(3):
            in_ns(evil_ns, "ping", "-c", "1", "-W", "1", client["ip"], check=False)
        assert f"{victim['mac']} dst {h1.vtep} self permanent" in _fdb(h2, device)
        assert victim["mac"] not in _fdb(h1, device)  # never learnt towards another node
        # The victim keeps its traffic, also once the client has forgotten every neighbour
        # (answered from host 1's published state by host 2's bridge).
        in_ns(client["ns"], "ip", "neigh", "flush", "all")
        assert await ping_settles(client["ns"], victim["ip"])
        neighbour = in_ns(client["ns"], "ip", "neigh", "show", victim["ip"]).stdout
        assert victim["mac"] in neighbour

        # A MAC that is no node's port: its frames from host 3 are dropped at host 2.
        in_ns(evil_ns, "ip", "link", "set", "eth0", "address", "fa:16:3e:66:66:66")
        in_ns(evil_ns, "ip", "addr", "flush", "dev", "eth0")
        in_ns(evil_ns, "ip", "addr", "add", "10.77.0.246/24", "dev", "eth0")
        assert not await ping_settles(evil_ns, client["ip"], False, within=3.0)
    finally:
        await lease.revoke()
        for liar in liars:
            await delete_prefix(etcd, keys.state_node_prefix(liar))


def _fixed(ip: str) -> dict[str, str]:
    return {"ip_address": ip, "subnet_id": "s", "cidr": "10.77.0.0/24", "gateway_ip": "10.77.0.1"}
