"""A routed site for the L3 agent's tests: two simulated hosts, two tenant networks behind one
Neutron router, an external flat network on host 1 and an "outside" namespace on it.

Host 1 runs podwire's agent with the external physnet mapped to ``phys0`` (one end of a veth
whose other end is the outside namespace's ``eth0``) and Neutron's L3 agent; host 2 only
podwire's agent. Pods come from real CNI ADDs; everything else through Neutron's API.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podwire.config import EtcdSettings
from podwire.schema.ports import tap_name
from tests.agent.harness import HostAgent, cni_pod
from tests.agent.netenv import NetEnv, in_ns
from tests.agent.sgnet import ECHO
from tests.neutron_agents.agents import NeutronAgentRun
from tests.neutron_agents.conftest import L3_AGENT, alive_in_neutron
from tests.scripted_agent import eventually

OUTSIDE_IP = "203.0.113.1"
TENANT_CIDRS = ("10.97.1.0/24", "10.97.2.0/24")
# Network 1's subnet carries a host route; its pods must install it.
HOST_ROUTE = {"destination": "198.18.0.0/15", "nexthop": "10.97.1.254"}
WEB_PORT = 8080  # the port the pods' group admits
OTHER_PORT = 9090  # served by the pods too, admitted by no rule
SNAT_PORT = 7000  # the outside's server that answers with the address it saw
VLAN_PHYSNET = "physnet1"  # the stack's VLAN ranges are on it


@dataclass
class Site:
    hosts: list[HostAgent]
    outside: str
    physnet: str
    external: Any
    networks: list[Any]
    router: Any
    group: Any
    l3: NeutronAgentRun
    servers: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def gateway_ip(self) -> str:
        return str(self.router.external_gateway_info["external_fixed_ips"][0]["ip_address"])

    def serve(self, ns: str, port: int, tell_peer: bool = False) -> None:
        argv = ["ip", "netns", "exec", ns, sys.executable, ECHO, "serve", "tcp", str(port)]
        proc = subprocess.Popen([*argv, *(["peer"] if tell_peer else [])], stdout=subprocess.PIPE,
                                text=True)  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        self.servers.append(proc)

    async def close(self) -> None:
        """The servers and podwire's agents stop; Neutron's side goes with the project."""
        for proc in self.servers:
            proc.kill()
            proc.wait()
        for agent in self.hosts:
            await agent.stop()


def answer(ns: str, address: str, port: int) -> str | None:
    """The first answer of one TCP flow from ``ns`` (None: no connection)."""
    argv = ["ip", "netns", "exec", ns, sys.executable, ECHO, "client", "tcp", address, str(port)]
    proc = subprocess.run(argv, input="ping\n", capture_output=True, text=True, timeout=15)
    lines = proc.stdout.splitlines()
    return lines[1] if lines[:1] == ["connected"] and len(lines) > 1 else None


async def settles(ns: str, address: str, port: int, wanted: bool, within: float = 30.0) -> bool:
    """Whether flows from ``ns`` to ``address:port`` come to connect (or to fail) in time."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        got = await asyncio.to_thread(answer, ns, address, port) is not None
        if got == wanted or asyncio.get_running_loop().time() >= deadline:
            return got == wanted
        await asyncio.sleep(0.3)


def outside_namespace(netenv: NetEnv, host_ns: str, vlan: int | None = None) -> str:
    """The outside: a namespace whose ``eth0`` is the other end of host 1's ``phys0`` (its
    address on ``eth0.<vlan>`` for a VLAN external network)."""
    outside = netenv.namespace("out")
    in_ns(host_ns, "ip", "link", "add", "phys0", "type", "veth", "peer", "name", "eth0",
          "netns", outside)  # fmt: skip
    in_ns(host_ns, "ip", "link", "set", "phys0", "up")
    in_ns(outside, "ip", "link", "set", "eth0", "up")
    device = "eth0"
    if vlan is not None:
        device = f"eth0.{vlan}"
        in_ns(outside, "ip", "link", "add", "link", "eth0", "name", device, "type", "vlan",
              "id", str(vlan))  # fmt: skip
        in_ns(outside, "ip", "link", "set", device, "up")
    in_ns(outside, "ip", "addr", "add", f"{OUTSIDE_IP}/24", "dev", device)
    return outside


def external_network(
    neutron: Any, project_id: str, physnet: str, prefix: str = "203.0.113", vlan: int | None = None
) -> Any:
    """A flat (or VLAN ``vlan``) external network on ``physnet`` whose ``.1`` is the
    outside's address."""
    net = neutron.network
    segment: dict[str, Any] = {"provider_network_type": "flat"}
    if vlan is not None:
        segment = {"provider_network_type": "vlan", "provider_segmentation_id": vlan}
    external = net.create_network(
        name="pw-ext", project_id=project_id, provider_physical_network=physnet,
        is_router_external=True, **segment,
    )  # fmt: skip
    net.create_subnet(
        network_id=external.id, cidr=f"{prefix}.0/24", ip_version=4, project_id=project_id,
        gateway_ip=f"{prefix}.1", is_dhcp_enabled=False,
        allocation_pools=[{"start": f"{prefix}.10", "end": f"{prefix}.99"}],
    )  # fmt: skip
    return external


def tenant_networks(neutron: Any, project_id: str) -> list[tuple[Any, Any]]:
    made = []
    for index, cidr in enumerate(TENANT_CIDRS, start=1):
        network = neutron.network.create_network(name=f"pw-l3-{index}", project_id=project_id)
        subnet = neutron.network.create_subnet(
            network_id=network.id, cidr=cidr, ip_version=4, project_id=project_id,
            is_dhcp_enabled=False, host_routes=[HOST_ROUTE] if index == 1 else [],
        )  # fmt: skip
        made.append((network, subnet))
    return made


def web_group(neutron: Any, project_id: str) -> Any:
    """Ingress tcp/WEB_PORT from anywhere, nothing else (egress: Neutron's defaults)."""
    group = neutron.network.create_security_group(name="pw-l3-web", project_id=project_id)
    neutron.network.create_security_group_rule(
        security_group_id=group.id, direction="ingress", ethertype="IPv4", protocol="tcp",
        port_range_min=WEB_PORT, port_range_max=WEB_PORT,
    )  # fmt: skip
    return group


async def router_ports_active(neutron: Any, router_id: str, count: int) -> list[Any]:
    async def active() -> list[Any] | None:
        ports = await asyncio.to_thread(lambda: list(neutron.network.ports(device_id=router_id)))
        ready = len(ports) == count and all(p.status == "ACTIVE" for p in ports)
        return ports if ready else None

    found: list[Any] = await eventually(active, f"{count} router ports ACTIVE", timeout=90)
    return found


async def build_site(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    neutron: Any,
    project_id: str,
    l3_agents: Callable[..., NeutronAgentRun],
    tmp_path: Path,
    vlan: int | None = None,
) -> Site:
    """``vlan``: the external network is that VLAN of the stack's ``physnet1`` instead of a
    flat network on a physnet of its own (Neutron allows one flat network per physnet)."""
    physnet = f"ext{uuid.uuid4().hex[:6]}" if vlan is None else VLAN_PHYSNET
    hosts = []
    for index, host in enumerate(hostnames, start=1):
        ns, vtep = netenv.host(index)
        agent = HostAgent(host, ns, vtep, tmp_path, etcd_settings, neutron_endpoint)
        agent.security_groups = "enforce"
        hosts.append(agent)
    outside = outside_namespace(netenv, hosts[0].netns, vlan)
    hosts[0].physnets = {physnet: "phys0"}
    for agent in hosts:
        await agent.start()
    l3 = l3_agents(hosts[0].host, hosts[0].netns)
    await alive_in_neutron(neutron, hosts[0].host, L3_AGENT)
    external = external_network(neutron, project_id, physnet, vlan=vlan)
    tenants = tenant_networks(neutron, project_id)
    router = neutron.network.create_router(
        name="pw-l3", project_id=project_id, external_gateway_info={"network_id": external.id}
    )
    for _, subnet in tenants:
        neutron.network.add_interface_to_router(router, subnet_id=subnet.id)
    await router_ports_active(neutron, router.id, 1 + len(tenants))
    return Site(
        hosts, outside, physnet, external, [n for n, _ in tenants],
        neutron.network.get_router(router.id), web_group(neutron, project_id), l3,
    )  # fmt: skip


async def pod(site: Site, host: int, network: int, netenv: NetEnv, tmp: Path) -> dict[str, str]:
    """A pod of the site's group on ``network`` of ``host`` (indices from 0), serving
    WEB_PORT and OTHER_PORT."""
    made = await cni_pod(site.hosts[host], netenv, site.networks[network].id, site.group.id, tmp)
    for port in (WEB_PORT, OTHER_PORT):
        site.serve(made["ns"], port)
    return made


def tap_guest(
    site: Site, neutron: Any, project_id: str, netenv: NetEnv, host: int
) -> dict[str, str]:
    """A VM's port on network 1 of ``host`` (indices from 0): a ``compute:nova`` port bound
    there, and a guest namespace behind a veth named as Nova names the tap (the node agent
    adopts it as it adopts QEMU's). The guest configures its address and route itself, as a
    guest does from DHCP; it serves OTHER_PORT, and WEB_PORT answering with the client's
    address (so an answer shows that the guest, not a pod, took the flow)."""
    network = site.networks[0]
    (subnet,) = neutron.network.subnets(network_id=network.id)
    port = neutron.network.create_port(
        network_id=network.id, project_id=project_id, device_owner="compute:nova",
        device_id=str(uuid.uuid4()), binding_host_id=site.hosts[host].host,
        security_group_ids=[site.group.id],
    )  # fmt: skip
    guest = netenv.namespace("vm")
    in_ns(site.hosts[host].netns, "ip", "link", "add", tap_name(port.id), "type", "veth",
          "peer", "eth0", "netns", guest)  # fmt: skip
    address = port.fixed_ips[0]["ip_address"]
    in_ns(guest, "ip", "link", "set", "eth0", "address", port.mac_address, "up")
    in_ns(guest, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
    in_ns(guest, "ip", "route", "add", "default", "via", subnet.gateway_ip)
    site.serve(guest, WEB_PORT, tell_peer=True)
    site.serve(guest, OTHER_PORT)
    return {"ns": guest, "ip": address, "port": str(port.id)}
