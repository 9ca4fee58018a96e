"""A guest on a podwire network gets its lease from the real DHCP agent's dnsmasq.

Everything is real: podwire's node agent on a simulated host adopts the DHCP agent's tap (made
by the ``podwire`` interface driver) and the guest's tap (a veth named as Nova names it, as in
tests/agent/test_taps.py), Neutron's DHCP agent runs through ``podwire neutron-agent dhcp`` on
the session's RPC bus, and busybox's ``udhcpc`` asks for the lease inside the guest namespace.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from podwire.config import EtcdSettings
from podwire.schema.ports import tap_name
from tests.agent.conftest import hostnames  # noqa: F401
from tests.agent.harness import HostAgent
from tests.agent.netenv import NetEnv, in_ns
from tests.neutron_agents.agents import NeutronAgentRun, dhcp_port, taps
from tests.neutron_agents.conftest import alive_in_neutron
from tests.scripted_agent import eventually

BUSYBOX = Path("/bin/busybox")


@pytest.fixture
async def node(
    netenv: NetEnv,
    hostnames: list[str],  # noqa: F811
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
) -> AsyncIterator[HostAgent]:
    ns, vtep = netenv.host(1)
    agent = HostAgent(hostnames[0], ns, vtep, tmp_path, etcd_settings, neutron_endpoint)
    agent.security_groups = "enforce"  # a guest without an address may still ask for one
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


async def status(neutron: Any, port_id: str, wanted: str, timeout: float = 60) -> Any:
    async def probe() -> Any:
        port = await asyncio.to_thread(neutron.network.get_port, port_id)
        return port if port.status == wanted else None

    return await eventually(probe, f"port {port_id} {wanted}", timeout=timeout)


def lease(guest: str) -> str:
    """The address udhcpc was offered and acknowledged ('' if none within ~10 s)."""
    result = in_ns(
        guest, str(BUSYBOX), "udhcpc", "-i", "eth0", "-n", "-q", "-t", "5", "-T", "2",
        "-s", "/bin/true", check=False,
    )  # fmt: skip
    for line in (result.stdout + result.stderr).splitlines():
        if "lease of" in line and "obtained" in line:
            return line.split("lease of", 1)[1].split()[0]
    return ""


async def dhcp_served(neutron: Any, network_id: str) -> Any:
    async def active() -> Any:
        port = await asyncio.to_thread(dhcp_port, neutron, network_id)
        return port if port is not None and port.status == "ACTIVE" else None

    return await eventually(active, "the DHCP port wired and ACTIVE", timeout=90)


@pytest.mark.slow
@pytest.mark.skipif(not BUSYBOX.exists(), reason="needs busybox-static (udhcpc)")
async def test_guest_gets_its_lease_and_again_after_the_dhcp_agent_restarts(
    node: HostAgent,
    netenv: NetEnv,
    neutron: Any,
    project_id: str,
    dhcp_agents: Callable[..., NeutronAgentRun],
) -> None:
    run = dhcp_agents(node.host, node.netns)
    await alive_in_neutron(neutron, node.host)
    network = neutron.network.create_network(name="pw-dhcp-e2e", project_id=project_id)
    neutron.network.create_subnet(
        network_id=network.id, cidr="10.96.0.0/24", ip_version=4, project_id=project_id
    )
    server = await dhcp_served(neutron, network.id)
    assert server.binding_host_id == node.host and server.binding_vif_type == "tap"
    assert taps(node.netns)[tap_name(server.id)]["master"].startswith("pwbr")

    port = neutron.network.create_port(
        network_id=network.id,
        project_id=project_id,
        device_owner="compute:nova",
        device_id=str(uuid.uuid4()),
        binding_host_id=node.host,
    )
    guest = netenv.namespace("vm")
    in_ns(node.netns, "ip", "link", "add", tap_name(port.id), "type", "veth", "peer", "eth0",
          "netns", guest)  # fmt: skip
    in_ns(guest, "ip", "link", "set", "eth0", "address", port.mac_address, "up")
    await status(neutron, port.id, "ACTIVE")
    address = port.fixed_ips[0]["ip_address"]
    assert lease(guest) == address

    # The DHCP agent restarted: its pair is removed and made again, and it serves again.
    assert run.stop() == 0
    assert tap_name(server.id) not in taps(node.netns)
    again = dhcp_agents(node.host, node.netns)
    await alive_in_neutron(neutron, node.host)
    served = await dhcp_served(neutron, network.id)
    assert served.id == server.id  # the same port, replugged

    async def leased() -> bool:
        return await asyncio.to_thread(lease, guest) == address

    await eventually(leased, "a lease from the restarted agent", timeout=60)
    assert again.stop() == 0
