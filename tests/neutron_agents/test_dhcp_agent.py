"""The real neutron-dhcp-agent through ``podwire neutron-agent dhcp``, on the session's stack
(RabbitMQ + neutron-rpc-server), with a simulated host's namespace and real dnsmasq."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from podwire.agent import naming
from podwire.config import EtcdSettings
from podwire.stack.procs import running as process_running
from tests.agent.harness import HostAgent
from tests.agent.netenv import NetEnv
from tests.conftest import PODWIRE
from tests.neutron_agents.agents import NeutronAgentRun, dhcp_port, taps
from tests.neutron_agents.conftest import alive_in_neutron
from tests.neutron_agents.netinfo import addresses, links, namespaces
from tests.scripted_agent import ScriptedAgent, eventually

TAP_CAPABILITIES = (["veth", "tap"], ["vxlan", "flat", "vlan"])


def dhcp_network(neutron: Any, project_id: str, cidr: str) -> Any:
    network = neutron.network.create_network(name="pw-dhcp", project_id=project_id)
    neutron.network.create_subnet(
        network_id=network.id, cidr=cidr, ip_version=4, project_id=project_id
    )
    return network


@pytest.mark.slow
async def test_dhcp_agent_serves_a_subnet_on_its_host_and_leaves_nothing(
    neutron: Any,
    netenv: NetEnv,
    project_id: str,
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
    dhcp_agents: Callable[..., NeutronAgentRun],
) -> None:
    """With podwire's own agent on the host: it adopts the DHCP agent's tap (the port's
    binding says ``tap``) onto the network's bridge."""
    host_ns, vtep = netenv.host(1)
    host_agent = HostAgent(f"{netenv.tag}-h1", host_ns, vtep, tmp_path, etcd_settings,
                           neutron_endpoint)  # fmt: skip
    await host_agent.start()
    try:
        run = dhcp_agents(host_agent.host, host_ns)
        await alive_in_neutron(neutron, host_agent.host)
        network = dhcp_network(neutron, project_id, "10.93.0.0/24")

        async def bound() -> Any:
            port = dhcp_port(neutron, network.id)
            return port if port is not None and port.binding_vif_type != "unbound" else None

        port = await eventually(bound, "the DHCP port bound", timeout=60)
        assert port.binding_host_id == host_agent.host
        assert port.binding_vif_type == "tap"
        qdhcp, device, tap = f"qdhcp-{network.id}", "ns-" + port.id[:11], "tap" + port.id[:11]
        address = f"{port.fixed_ips[0]['ip_address']}/24"

        async def served() -> bool:
            pid = run.dnsmasq_pid(network.id)
            return bool(address in addresses(qdhcp, device) and pid and process_running(pid))

        await eventually(served, "dnsmasq serving in the qdhcp namespace", timeout=60)
        assert links(qdhcp)[device]["address"] == port.mac_address
        pid = run.dnsmasq_pid(network.id)
        assert pid is not None
        assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"dnsmasq")
        host_end = taps(host_ns)[tap]
        assert host_end["linkinfo"]["info_kind"] == "veth"
        assert host_end["master"] == naming.bridge(network.id)
        assert f"ifdriver.adopted port={port.id} tap={tap}" in run.log_text

        assert run.stop() == 0
        assert not process_running(pid)
        assert qdhcp not in namespaces()
        assert taps(host_ns) == {}
    finally:
        await host_agent.stop()


@pytest.mark.slow
async def test_dhcp_agent_on_a_host_that_never_adopts_fails_clearly_and_cleanly(
    neutron: Any,
    project_id: str,
    netenv: NetEnv,
    agents: Callable[[], ScriptedAgent],
    dhcp_agents: Callable[..., NeutronAgentRun],
) -> None:
    host_agent = agents()
    await host_agent.register(capabilities=TAP_CAPABILITIES)
    host_ns = netenv.namespace("h1")
    run = dhcp_agents(host_agent.host, host_ns, adopt_timeout=2.0)
    await alive_in_neutron(neutron, host_agent.host)
    network = dhcp_network(neutron, project_id, "10.94.0.0/24")

    async def refused() -> bool:
        return "did not put tap" in run.log_text

    await eventually(refused, "the plug's error in the agent's log", timeout=90)
    line = next(line for line in run.log_text.splitlines() if "did not put tap" in line)
    assert host_agent.host in line and host_ns in line and "binding_failed" in line
    await asyncio.sleep(0.5)
    assert run.stop() == 0
    assert f"qdhcp-{network.id}" not in namespaces()
    assert taps(host_ns) == {}
    assert run.dnsmasq_pid(network.id) is None


def test_refused_on_a_stack_without_rpc_bus(tmp_path: Path) -> None:
    (tmp_path / "stack.json").write_text(json.dumps({"pids": {}, "etcd": "http://x"}))
    result = subprocess.run(
        [*PODWIRE, "neutron-agent", "dhcp", "--data-dir", str(tmp_path), "--host", "h1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "stack up --rpc" in result.stderr
    missing = subprocess.run(
        [*PODWIRE, "neutron-agent", "dhcp", "--data-dir", str(tmp_path / "no"), "--host", "h"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "no stack is running" in missing.stderr
