"""Fixtures of the agent suite: per-test host names and agents (namespaces: tests/conftest.py).

The two-agent set-up is written once, ``two_agents``; the fixtures ``agents`` and
``enforcing_agents`` and the suites that need more around it (memif's kubelet) all use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
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
    """A VXLAN network with a /24 in this test's project (removed with the project).

    Neutron allocates only up to .199: tests forge sources above it (spoofing, peers'
    values), which must never be a port's address Neutron handed out to another pod."""
    network = neutron.network.create_network(name="pw-agent-a", project_id=project_id)
    neutron.network.create_subnet(
        network_id=network.id,
        cidr="10.77.0.0/24",
        ip_version=4,
        project_id=project_id,
        gateway_ip="10.77.0.1",
        allocation_pools=[{"start": "10.77.0.2", "end": "10.77.0.199"}],
    )
    return network


@contextlib.asynccontextmanager
async def two_agents(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
    security_groups: str | None = None,
    extra: Callable[[int], dict[str, Any]] = lambda _index: {},
) -> AsyncIterator[list[HostAgent]]:
    """An agent on each simulated host (namespaces on one underlay), Neutron VIF source,
    started in order and all stopped however the test ends.

    What each host must wire reaches it the real way: the stack's Neutron binds the port to
    the agent's (alive, VTEP-reporting) host and the ml2 forwarder writes the desired key.
    ``security_groups``: the agents' mode (the harness's default when None); ``extra``: more
    ``HostAgent`` arguments for the host of that index (from 1).
    """
    running = []
    for index, host in enumerate(hostnames, start=1):
        ns, vtep = netenv.host(index)
        agent = HostAgent(host, ns, vtep, tmp_path, etcd_settings, neutron_endpoint, **extra(index))
        if security_groups is not None:
            agent.security_groups = security_groups
        running.append(agent)
    try:
        for agent in running:
            await agent.start()
        yield running
    finally:
        for agent in running:
            await agent.stop()


@pytest.fixture
async def agents(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
) -> AsyncIterator[list[HostAgent]]:
    """Two agents with the harness's default security-group mode."""
    args = (netenv, hostnames, etcd_settings, neutron_endpoint, tmp_path)
    async with two_agents(*args) as running:
        yield running


@pytest.fixture
async def enforcing_agents(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
) -> AsyncIterator[list[HostAgent]]:
    """Two agents enforcing security groups; the policy reaches them only through the real
    ml2 forwarder."""
    args = (netenv, hostnames, etcd_settings, neutron_endpoint, tmp_path)
    async with two_agents(*args, security_groups="enforce") as running:
        yield running


@pytest.fixture(params=["c", "python"])
def plugin(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Both builds of the CNI plugin: every test using this runs against each."""
    return plugin_binary(request.param, tmp_path)
