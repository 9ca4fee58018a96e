"""Neutron's own L3 agent on a podwire node: routers, source NAT and floating IPs, for pods
and for a VM's tap port.

All real: ``podwire neutron-agent l3`` (neutron-l3-agent, interface_driver = podwire) on the
session's RabbitMQ and Neutron, podwire's agents on two simulated hosts joined by VXLAN, pods
from CNI ADDs, an outside namespace on host 1's external physnet, and every router, interface
and floating IP made through Neutron's API as a user makes them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import openstack
import pytest

from podwire.agent.app import vlan_capable
from podwire.config import EtcdSettings
from podwire.schema.ports import tap_name
from tests.agent.conftest import hostnames  # noqa: F401
from tests.agent.harness import cni_pod
from tests.agent.netenv import NetEnv, in_ns, links_in, sh
from tests.neutron_agents.agents import NeutronAgentRun
from tests.neutron_agents.conftest import L3_AGENT, alive_in_neutron
from tests.neutron_agents.netinfo import links, namespaces
from tests.neutron_agents.routing import (
    HOST_ROUTE,
    OTHER_PORT,
    OUTSIDE_IP,
    SNAT_PORT,
    WEB_PORT,
    Site,
    answer,
    build_site,
    external_network,
    pod,
    router_ports_active,
    settles,
    tap_guest,
)
from tests.scripted_agent import eventually

pytestmark = pytest.mark.slow


@pytest.fixture
async def sites(
    netenv: NetEnv,
    hostnames: list[str],  # noqa: F811
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    neutron: Any,
    project_id: str,
    l3_agents: Callable[..., NeutronAgentRun],
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Awaitable[Site]]]:
    """Builds the routed site (``vlan``: its external network a VLAN); closes it after."""
    built: list[Site] = []

    async def build(vlan: int | None = None) -> Site:
        built.append(await build_site(netenv, hostnames, etcd_settings, neutron_endpoint,
                                      neutron, project_id, l3_agents, tmp_path, vlan))  # fmt: skip
        return built[-1]

    try:
        yield build
    finally:
        for made in built:
            await made.close()


@pytest.fixture
async def site(sites: Callable[..., Awaitable[Site]]) -> Site:
    return await sites()


async def test_routes_between_networks_snats_and_follows_floating_ips(
    site: Site, netenv: NetEnv, neutron: Any, project_id: str, tmp_path: Path
) -> None:
    a = await pod(site, 0, 0, netenv, tmp_path)  # host 1, network 1: the router's host
    b = await pod(site, 1, 1, netenv, tmp_path)  # host 2, network 2: across VXLAN
    # The subnet's gateway is the default route, its host route is installed too.
    routes = in_ns(a["ns"], "ip", "route").stdout
    assert "default via 10.97.1.1 dev eth0" in routes
    assert f"{HOST_ROUTE['destination']} via {HOST_ROUTE['nexthop']} dev eth0" in routes
    # East-west through the router; the group still decides what arrives.
    assert await settles(a["ns"], b["ip"], WEB_PORT, True)
    assert await settles(b["ns"], a["ip"], WEB_PORT, True)
    assert answer(a["ns"], b["ip"], OTHER_PORT) is None
    # Out through the router's source NAT: the outside sees the gateway's address.
    site.serve(site.outside, SNAT_PORT, tell_peer=True)
    assert answer(b["ns"], OUTSIDE_IP, SNAT_PORT) == site.gateway_ip
    assert answer(a["ns"], OUTSIDE_IP, SNAT_PORT) == site.gateway_ip

    net = neutron.network
    floating = net.create_ip(floating_network_id=site.external.id, project_id=project_id)
    address = floating.floating_ip_address
    assert not await settles(site.outside, address, WEB_PORT, True, within=1)
    net.update_ip(floating, port_id=_port_of(neutron, b["mac"]))
    assert await settles(site.outside, address, WEB_PORT, True)
    assert answer(site.outside, address, OTHER_PORT) is None  # the group admits 8080 only
    # The pod answers from its floating IP, also to what it opens itself.
    assert answer(b["ns"], OUTSIDE_IP, SNAT_PORT) == address

    net.update_ip(floating, port_id=None)
    assert await settles(site.outside, address, WEB_PORT, False)
    net.update_ip(floating, port_id=_port_of(neutron, a["mac"]))
    assert await settles(site.outside, address, WEB_PORT, True)
    assert answer(a["ns"], OUTSIDE_IP, SNAT_PORT) == address

    # A VM's tap port on host 2 behind the same router: east-west, and the floating IP.
    vm = tap_guest(site, neutron, project_id, netenv, 1)
    assert await settles(vm["ns"], b["ip"], WEB_PORT, True)
    # Moved straight from pod a: flows reach the guest (it answers with the outside's own
    # address, pod a only echoes) and nothing else does.
    net.update_ip(floating, port_id=vm["port"])

    async def guest_answers() -> bool:
        return await asyncio.to_thread(answer, site.outside, address, WEB_PORT) == OUTSIDE_IP

    await eventually(guest_answers, "the floating IP's flows to reach the guest")
    assert answer(site.outside, address, OTHER_PORT) is None
    assert answer(vm["ns"], OUTSIDE_IP, SNAT_PORT) == address


def _port_of(neutron: Any, mac: str) -> str:
    (port,) = neutron.network.ports(mac_address=mac)
    return str(port.id)


async def test_interfaces_and_both_agents_restart_while_pods_run(
    site: Site,
    netenv: NetEnv,
    neutron: Any,
    project_id: str,
    l3_agents: Callable[..., NeutronAgentRun],
    tmp_path: Path,
) -> None:
    a = await pod(site, 0, 0, netenv, tmp_path)
    b = await pod(site, 1, 1, netenv, tmp_path)
    net = neutron.network
    floating = net.create_ip(floating_network_id=site.external.id, project_id=project_id,
                             port_id=_port_of(neutron, a["mac"]))  # fmt: skip
    address = floating.floating_ip_address
    assert await settles(site.outside, address, WEB_PORT, True)
    assert await settles(a["ns"], b["ip"], WEB_PORT, True)
    pod_links = links_in(b["ns"])

    # An interface removed and added back while the pods run: only the route changes.
    (subnet,) = net.subnets(network_id=site.networks[1].id)
    net.remove_interface_from_router(site.router, subnet_id=subnet.id)
    assert await settles(a["ns"], b["ip"], WEB_PORT, False)
    net.add_interface_to_router(site.router, subnet_id=subnet.id)
    # Within seconds, not when the pods' neighbour caches expire: the new interface has a new
    # MAC for the same gateway address, and the remote node relays its gratuitous ARP.
    assert await settles(a["ns"], b["ip"], WEB_PORT, True, within=10)
    assert links_in(b["ns"]) == pod_links

    # The L3 agent restarted with its router in place: served again, nothing twice.
    assert site.l3.stop() == 0
    assert f"qrouter-{site.router.id}" not in namespaces()
    l3_agents(site.hosts[0].host, site.hosts[0].netns)
    await alive_in_neutron(neutron, site.hosts[0].host, L3_AGENT)
    assert await settles(site.outside, address, WEB_PORT, True, within=90)
    assert await settles(a["ns"], b["ip"], WEB_PORT, True)
    ports = await router_ports_active(neutron, site.router.id, 3)
    assert _router_devices(site.router.id) == sorted(_device(p) for p in ports)
    host_links = links(site.hosts[0].netns)
    assert all(host_links[tap_name(p.id)]["master"].startswith("pwbr") for p in ports)

    # podwire's agent on the router's host restarted: the router's taps adopted again.
    await site.hosts[0].stop()
    await site.hosts[0].start()
    assert await settles(site.outside, address, WEB_PORT, True, within=10)
    assert await settles(b["ns"], a["ip"], WEB_PORT, True, within=10)


def _router_devices(router_id: str) -> list[str]:
    return sorted(name for name in links_in(f"qrouter-{router_id}") if name != "lo")


def _device(port: Any) -> str:
    prefix = "qg-" if port.device_owner == "network:router_gateway" else "qr-"
    return prefix + str(port.id)[:11]


async def test_bad_requests_and_vanishing_parts_leave_the_node_serving(
    site: Site, netenv: NetEnv, neutron: Any, project_id: str, tmp_path: Path
) -> None:
    a = await pod(site, 0, 0, netenv, tmp_path)
    b = await pod(site, 1, 1, netenv, tmp_path)
    net = neutron.network

    # A floating IP for a port on a network no router of its external network reaches.
    lonely = net.create_network(name="pw-l3-lonely", project_id=project_id)
    net.create_subnet(network_id=lonely.id, cidr="10.97.9.0/24", ip_version=4,
                      project_id=project_id, gateway_ip=None)  # fmt: skip
    stray = net.create_port(network_id=lonely.id, project_id=project_id)
    # ... and a pod there: a subnet without a gateway gives no default route.
    loner = await cni_pod(site.hosts[0], netenv, lonely.id, site.group.id, tmp_path)
    assert in_ns(loner["ns"], "ip", "route").stdout.split() == [
        "10.97.9.0/24", "dev", "eth0", "proto", "kernel", "scope", "link", "src", loner["ip"],
    ]  # fmt: skip
    with pytest.raises(openstack.exceptions.HttpException, match="not reachable"):
        net.create_ip(floating_network_id=site.external.id, port_id=stray.id,
                      project_id=project_id)  # fmt: skip

    # A router whose gateway is on a physnet no node maps: its gateway port fails to bind,
    # the L3 agent's log says why its plug failed, and the first router still routes.
    nowhere = external_network(neutron, project_id, f"nowhere{uuid.uuid4().hex[:6]}",
                               "198.51.100")  # fmt: skip
    stranded = net.create_router(name="pw-l3-stranded", project_id=project_id,
                                 external_gateway_info={"network_id": nowhere.id})  # fmt: skip
    (gateway,) = net.ports(device_id=stranded.id, device_owner="network:router_gateway")

    async def failed() -> bool:
        port = await asyncio.to_thread(net.get_port, gateway.id)
        return port.binding_vif_type == "binding_failed"

    await eventually(failed, "the stranded gateway port binding_failed", timeout=60)

    async def logged() -> bool:
        return f"port {gateway.id}: podwire's node agent did not put" in site.l3.log_text

    await eventually(logged, "the L3 agent logging the failed plug", timeout=60)
    assert await settles(a["ns"], b["ip"], WEB_PORT, True)

    # The outside namespace gone (the physnet's interface with it): the node serves on.
    sh("ip", "netns", "delete", site.outside)
    assert await settles(b["ns"], a["ip"], WEB_PORT, True)
    assert site.hosts[0].task is not None and not site.hosts[0].task.done()

    # The router deleted while its ports are adopted: its namespace and taps go.
    ports = [p.id for p in net.ports(device_id=site.router.id)]
    net.update_router(site.router, external_gateway_info=None)
    for subnet in [s for n in site.networks for s in net.subnets(network_id=n.id)]:
        net.remove_interface_from_router(site.router, subnet_id=subnet.id)
    net.delete_router(site.router)

    async def gone() -> bool:
        taps = set(links_in(site.hosts[0].netns))
        return f"qrouter-{site.router.id}" not in namespaces() and not any(
            tap_name(port) in taps for port in ports
        )

    await eventually(gone, "the router's namespace and taps removed", timeout=60)
    assert not await settles(a["ns"], b["ip"], WEB_PORT, True, within=1)


@pytest.mark.skipif(
    not vlan_capable(), reason="kernel lacks 8021q (VLAN): no VLAN external network"
)
async def test_a_vlan_external_network_serves_snat_and_floating_ips(
    sites: Callable[..., Awaitable[Site]],
    netenv: NetEnv,
    neutron: Any,
    project_id: str,
    tmp_path: Path,
) -> None:
    site = await sites(900 + uuid.uuid4().int % 99)
    a = await pod(site, 1, 0, netenv, tmp_path)
    site.serve(site.outside, SNAT_PORT, tell_peer=True)
    assert answer(a["ns"], OUTSIDE_IP, SNAT_PORT) == site.gateway_ip
    floating = neutron.network.create_ip(floating_network_id=site.external.id,
                                         project_id=project_id,
                                         port_id=_port_of(neutron, a["mac"]))  # fmt: skip
    assert await settles(site.outside, floating.floating_ip_address, WEB_PORT, True)
