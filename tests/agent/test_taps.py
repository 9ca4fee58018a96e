"""Tap ports (vif type ``tap``): a device someone else makes, adopted by the real agent.

Ports are VM ports (``compute:nova``) and Neutron agents' ports (``network:dhcp``) created
through the stack's real Neutron and bound to a simulated host; the device is a veth whose
host end carries Nova's tap name (``tap`` + port id[:11]) and whose other end sits in a
namespace playing the VM (what podwire's interface driver makes for a DHCP agent; QEMU's own
taps are in tests/vm/). Status comes back through the real ml2 feedback.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from openstack.exceptions import ConflictException

from podwire.schema.ports import tap_name
from tests.agent.harness import HostAgent, acni, plugin_binary
from tests.agent.netenv import NetEnv, in_ns, ping_settles
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    return plugin_binary("c", tmp_path)


@pytest.fixture
def web(neutron: Any, project_id: str) -> Iterator[Any]:
    """A group admitting ICMP from anywhere (Neutron adds its egress rules)."""
    net = neutron.network
    group = net.create_security_group(name="pw-tap-web", project_id=project_id)
    net.create_security_group_rule(
        security_group_id=group.id, direction="ingress", ethertype="IPv4", protocol="icmp"
    )
    yield group
    for port in list(net.ports(project_id=project_id)):
        net.delete_port(port)
    net.delete_security_group(group)


class Nic:
    """A device named like Nova's tap on a host, its other end in a namespace (the guest)."""

    def __init__(self, netenv: NetEnv, host_ns: str, port: Any, suffix: str) -> None:
        self.host_ns = host_ns
        self.port = port
        self.name = tap_name(port.id)
        self.guest = netenv.namespace(suffix)
        self.ip = port.fixed_ips[0]["ip_address"] if port.fixed_ips else ""

    def plug(self) -> None:
        """As QEMU or the interface driver would: the device appears, down, on no bridge."""
        in_ns(self.host_ns, "ip", "link", "add", self.name, "type", "veth", "peer", "eth0",
              "netns", self.guest)  # fmt: skip
        in_ns(self.guest, "ip", "link", "set", "eth0", "address", self.port.mac_address, "up")
        if self.ip:
            in_ns(self.guest, "ip", "addr", "add", f"{self.ip}/24", "dev", "eth0")

    def unplug(self) -> None:
        in_ns(self.host_ns, "ip", "link", "del", self.name, check=False)

    def master(self) -> str:
        out = in_ns(self.host_ns, "ip", "-o", "link", "show", self.name, check=False).stdout
        return out.split(" master ")[1].split()[0] if " master " in out else ""

    def exists(self) -> bool:
        return in_ns(self.host_ns, "ip", "link", "show", self.name, check=False).returncode == 0


def _vm_port(neutron: Any, net: Any, project: str, host: str, sgs: list[str], **extra: Any) -> Any:
    return neutron.network.create_port(
        network_id=net.id,
        project_id=project,
        device_owner=extra.pop("device_owner", "compute:nova"),
        device_id=str(uuid.uuid4()),
        binding_host_id=host,
        security_group_ids=sgs,
        **extra,
    )


async def _status(neutron: Any, port: Any, wanted: str) -> Any:
    async def probe() -> Any:
        found = await asyncio.to_thread(neutron.network.get_port, port.id)
        return found if found.status == wanted else None

    return await eventually(probe, f"port {port.id} {wanted}", timeout=15)


async def _pod(
    plugin: Path, agent: HostAgent, netenv: NetEnv, net: str, sg: str
) -> tuple[str, str]:
    ns = netenv.namespace(f"p{uuid.uuid4().hex[:4]}")
    call = await acni(
        plugin, "ADD", agent.conf(net, securityGroups=[sg]), container_id=uuid.uuid4().hex,
        netns=f"/run/netns/{ns}",
    )  # fmt: skip
    assert call.code == 0, call.stdout
    return ns, call.json["ips"][0]["address"].split("/")[0]


async def test_vm_port_adopted_filtered_down_when_gone_and_back(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
    web: Any,
) -> None:
    h1, h2 = enforcing_agents
    port = _vm_port(neutron, vxnet, project_id, h1.host, [web.id])
    assert port.binding_vif_type == "tap", port.binding_vif_type
    pod_ns, pod_ip = await _pod(plugin, h2, netenv, vxnet.id, web.id)
    nic = Nic(netenv, h1.netns, port, "vm")
    await _status(neutron, port, "DOWN")  # bound, no device yet

    nic.plug()
    await _status(neutron, port, "ACTIVE")
    assert nic.master().startswith("pwbr")
    # across hosts and VXLAN, both ways (the pod's group admits ICMP too)
    assert await ping_settles(pod_ns, nic.ip, True) and await ping_settles(nic.guest, pod_ip, True)
    # a spoofed source from the VM is dropped at its bridge port
    in_ns(nic.guest, "ip", "addr", "add", "10.77.0.249/24", "dev", "eth0")
    spoofed = in_ns(nic.guest, "ping", "-c1", "-W1", "-I", "10.77.0.249", pod_ip, check=False)
    assert spoofed.returncode != 0

    # the VM stops: its device goes, the port goes DOWN; it starts again: adopted again
    nic.unplug()
    await _status(neutron, port, "DOWN")
    nic.plug()
    await _status(neutron, port, "ACTIVE")
    assert await ping_settles(pod_ns, nic.ip, True)

    # the port leaves the host: the device leaves the bridge but stays its maker's
    neutron.network.delete_port(port)

    async def released() -> bool:
        return not nic.master()

    await eventually(released, "tap out of the bridge")
    assert nic.exists()


async def test_security_group_rule_admits_vm_traffic(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
    web: Any,
) -> None:
    h1, h2 = enforcing_agents
    net = neutron.network
    closed = net.create_security_group(name="pw-tap-closed", project_id=project_id)
    try:
        port = _vm_port(neutron, vxnet, project_id, h1.host, [closed.id])
        nic = Nic(netenv, h1.netns, port, "vm")
        nic.plug()
        await _status(neutron, port, "ACTIVE")
        pod_ns, _ = await _pod(plugin, h2, netenv, vxnet.id, web.id)
        assert not await ping_settles(pod_ns, nic.ip, False, within=2.0)
        net.create_security_group_rule(
            security_group_id=closed.id, direction="ingress", ethertype="IPv4", protocol="icmp"
        )
        assert await ping_settles(pod_ns, nic.ip, True)
    finally:
        for found in list(net.ports(project_id=project_id)):
            net.delete_port(found)
        net.delete_security_group(closed)


async def test_agent_restart_keeps_adopted_traffic_flowing(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
    web: Any,
) -> None:
    h1, h2 = enforcing_agents
    port = _vm_port(neutron, vxnet, project_id, h1.host, [web.id])
    nic = Nic(netenv, h1.netns, port, "vm")
    nic.plug()
    await _status(neutron, port, "ACTIVE")
    pod_ns, _ = await _pod(plugin, h2, netenv, vxnet.id, web.id)
    assert await ping_settles(pod_ns, nic.ip, True)
    flood = await asyncio.create_subprocess_exec(
        *("ip", "netns", "exec", pod_ns, "ping", "-q", "-i", "0.05", "-w", "8", nic.ip),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        await asyncio.sleep(1.0)
        await h1.stop()
        assert nic.master().startswith("pwbr")  # nothing is undone on the way down
        await h1.start()
        raw, _ = await asyncio.wait_for(flood.communicate(), 20)
    finally:
        if flood.returncode is None:
            flood.kill()
            await flood.wait()
    out = raw.decode()
    received = int(out.split(" received")[0].rsplit(" ", 1)[1])
    transmitted = int(out.split(" packets transmitted")[0].rsplit("\n", 1)[1])
    # Every echo across the restart answered but for a handful: the rules and the bridge
    # port stayed in place (the bound on the gap itself is a benchmark's, bench/tap_bench.py).
    assert transmitted - received <= transmitted // 10, out
    found = await asyncio.to_thread(neutron.network.get_port, port.id)
    assert found.status == "ACTIVE"


async def test_foreign_taps_left_alone_and_early_taps_adopted(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    neutron: Any,
    project_id: str,
    web: Any,
) -> None:
    h1, h2 = enforcing_agents

    unbound = SimpleNamespace(id=str(uuid.uuid4()), mac_address="fa:16:3e:12:34:56", fixed_ips=[])
    stray = Nic(netenv, h1.netns, unbound, "st")  # a tap-named device of no port at all
    stray.plug()
    elsewhere = _vm_port(neutron, vxnet, project_id, h2.host, [web.id])
    misplaced = Nic(netenv, h1.netns, elsewhere, "mp")  # on h1, but the port is h2's
    misplaced.plug()
    # a device that exists before its port is bound here: adopted once the binding arrives
    port = _vm_port(neutron, vxnet, project_id, "", [web.id])
    early = Nic(netenv, h1.netns, port, "ea")
    early.plug()
    neutron.network.update_port(port, binding_host_id=h1.host)
    await _status(neutron, port, "ACTIVE")
    assert early.master().startswith("pwbr")
    assert stray.master() == "" and misplaced.master() == ""
    found = await asyncio.to_thread(neutron.network.get_port, elsewhere.id)
    assert found.status == "DOWN"  # h2 has no device for it


async def test_device_churn_ends_in_the_state_of_the_last_event(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    neutron: Any,
    project_id: str,
    web: Any,
) -> None:
    """A device deleted and made again while it is being adopted (the rules take a few
    milliseconds): however the events interleave, the last one decides."""
    h1, _ = enforcing_agents
    port = _vm_port(neutron, vxnet, project_id, h1.host, [web.id])
    nic = Nic(netenv, h1.netns, port, "vm")
    for _ in range(10):
        nic.plug()
        nic.unplug()
    await asyncio.sleep(1.0)
    found = await asyncio.to_thread(neutron.network.get_port, port.id)
    assert found.status == "DOWN"
    nic.plug()
    await _status(neutron, port, "ACTIVE")
    assert nic.master().startswith("pwbr")


async def test_neutron_agent_ports_are_trusted(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
    web: Any,
) -> None:
    """A router or DHCP port (``network:*``) gets no security groups and no anti-spoofing,
    as Neutron's firewall drivers treat them: a router forwards other ports' addresses."""
    h1, h2 = enforcing_agents
    port = _vm_port(
        neutron, vxnet, project_id, h1.host, [], device_owner="network:router_interface"
    )
    nic = Nic(netenv, h1.netns, port, "rt")
    nic.plug()
    await _status(neutron, port, "ACTIVE")
    _, pod_ip = await _pod(plugin, h2, netenv, vxnet.id, web.id)
    in_ns(nic.guest, "ip", "addr", "add", "10.77.0.248/24", "dev", "eth0")
    assert await ping_settles(nic.guest, pod_ip, True)
    forwarded = in_ns(nic.guest, "ping", "-c1", "-W2", "-I", "10.77.0.248", pod_ip, check=False)
    assert forwarded.returncode == 0, forwarded.stdout


async def test_mac_changed_through_neutron_is_enforced_on_the_running_device(
    enforcing_agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
    web: Any,
) -> None:
    """Neutron refuses a new MAC on a bound port (nothing changes on the node); unbound,
    changed and bound again, the running device is adopted again and port security follows
    the new MAC: the guest still sending from the old one is dropped, the new one passes."""
    h1, h2 = enforcing_agents
    port = _vm_port(neutron, vxnet, project_id, h1.host, [web.id])
    nic = Nic(netenv, h1.netns, port, "vm")
    nic.plug()
    await _status(neutron, port, "ACTIVE")
    pod_ns, pod_ip = await _pod(plugin, h2, netenv, vxnet.id, web.id)
    assert await ping_settles(nic.guest, pod_ip, True)
    new_mac = "fa:16:3e:77:66:55"
    with pytest.raises(ConflictException, match="port is already bound"):
        neutron.network.update_port(port.id, mac_address=new_mac)
    assert await ping_settles(nic.guest, pod_ip, True)

    neutron.network.update_port(port.id, binding_host_id="")
    await eventually(_async(lambda: not nic.master()), "the tap released")
    neutron.network.update_port(port.id, mac_address=new_mac)
    neutron.network.update_port(port.id, binding_host_id=h1.host)
    await _status(neutron, port, "ACTIVE")
    assert not await ping_settles(nic.guest, pod_ip, False)
    in_ns(nic.guest, "ip", "link", "set", "eth0", "address", new_mac)
    # The pod still holds the old MAC in its ARP cache until that entry expires (tens of
    # seconds): the guest's gratuitous ARP stops at its node, whose VXLAN port suppresses
    # ARP (the new MAC reaches the other nodes as wired-port state instead). Once the pod
    # asks again, its node answers with the new MAC.
    in_ns(pod_ns, "ip", "neigh", "flush", "dev", "eth0")
    assert await ping_settles(nic.guest, pod_ip, True)


def _async(check: Any) -> Any:
    async def probe() -> Any:
        return check()

    return probe
