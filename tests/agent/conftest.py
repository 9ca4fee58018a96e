"""Fixtures of the agent suite: per-test host names and agents (namespaces: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.config import EtcdSettings
from podwire.etcd import EtcdClient
from tests.agent.harness import HostAgent, plugin_binary
from tests.agent.netenv import NetEnv
from tests.etcd_tools import delete_prefix


@pytest.fixture
async def hostnames(etcd: EtcdClient, netenv: NetEnv) -> AsyncIterator[list[str]]:
    """Two host names of this test's own; their etcd keys are removed afterwards."""
    names = [f"{netenv.tag}-h1", f"{netenv.tag}-h2"]
    yield names
    for name in names:
        await delete_prefix(etcd, keys.node_ports_prefix(name))
        await delete_prefix(etcd, keys.state_node_prefix(name))


@pytest.fixture
def vxnet(neutron: Any, project_id: str) -> Any:
    """A VXLAN network with a /24 in this test's project (removed with the project)."""
    network = neutron.network.create_network(name="pw-agent-a", project_id=project_id)
    neutron.network.create_subnet(
        network_id=network.id,
        cidr="10.77.0.0/24",
        ip_version=4,
        project_id=project_id,
        gateway_ip="10.77.0.1",
    )
    return network


@pytest.fixture
async def agents(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
) -> AsyncIterator[list[HostAgent]]:
    """Two agents on two simulated hosts (namespaces on one underlay), Neutron VIF source.

    What each host must wire reaches it the real way: the stack's Neutron binds the port to
    the agent's (alive, VTEP-reporting) host and the ml2 forwarder writes the desired key.
    """
    running = []
    for index, host in enumerate(hostnames, start=1):
        ns, vtep = netenv.host(index)
        running.append(HostAgent(host, ns, vtep, tmp_path, etcd_settings, neutron_endpoint))
    try:
        for agent in running:
            await agent.start()
        yield running
    finally:
        for agent in running:
            await agent.stop()


@pytest.fixture(params=["c", "python"])
def plugin(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Both builds of the CNI plugin: every test using this runs against each."""
    return plugin_binary(request.param, tmp_path)
