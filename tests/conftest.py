"""Session-wide real components: one local stack (etcd + MariaDB + Neutron) for all tests.

The stack is started lazily by the first test that asks for it, through the real
``podwire stack up`` command, and stopped with SIGTERM at the end of the session. Tests isolate
themselves by key prefix (etcd) and project id (Neutron) and remove what they create.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.log import TextFormatter
from podwire.neutron.client import neutron_connection
from podwire.neutron.routers import delete_routers
from podwire.stack import kube_control
from podwire.stack.client import start_background, stop_background
from tests.agent.netenv import NetEnv
from tests.etcd_tools import delete_prefix
from tests.scripted_agent import agents  # noqa: F401  (a fixture every suite may use)

PODWIRE = [sys.executable, "-m", "podwire.cli.main"]

start_stack = start_background
stop_stack = stop_background

# Fixtures that create kernel objects only root may (network namespaces). A test that uses one,
# directly or through another fixture, is marked ``netns`` here, so ``-m "not netns"`` (CI on
# the other Pythons) needs no hand-kept list; tests that create namespaces otherwise are marked
# in their module.
ROOT_KERNEL_FIXTURES = frozenset({"netenv"})
# The session's Neutron serves the default deployment and a second one, "tenant-b" (two
# clusters sharing one Neutron and one etcd: tests/controller/test_deployments.py).
SECOND_DEPLOYMENT = "tenant-b"
DEPLOYMENTS = f"podwire,{SECOND_DEPLOYMENT}"

# Fixtures that start real servers: the session's stack, or an etcd of the test's own.
STACK_FIXTURES = frozenset({"stack", "private_etcd", "authed", "cluster_stack", "kube_stack"})


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Captured log records of a failing test show their fields (``port=... error=...``),
    not only the event name."""
    plugin = config.pluginmanager.get_plugin("logging-plugin")
    for name in ("report_handler", "caplog_handler", "log_cli_handler"):
        handler = getattr(plugin, name, None)
        if handler is not None:
            handler.setFormatter(TextFormatter())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers from fixtures: ``netns`` (root kernel features) and ``stack`` (the session's
    etcd + MariaDB + Neutron), so ``scripts/check`` (``-m "not stack and not netns"``) selects
    the fast tests without a hand-kept list."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if ROOT_KERNEL_FIXTURES & used:
            item.add_marker(pytest.mark.netns)
        if STACK_FIXTURES & used:
            item.add_marker(pytest.mark.stack)


@pytest.fixture
def netenv() -> Iterator[NetEnv]:
    """Namespaces of this test's own (simulated hosts, pods), removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates network namespaces")
    env = NetEnv()
    try:
        yield env
    finally:
        env.cleanup()


@pytest.fixture(scope="session")
def work_dir() -> Iterator[Path]:
    """A short base path: MariaDB's unix socket path must stay under 108 characters."""
    path = Path(tempfile.mkdtemp(prefix="pw-", dir="/tmp"))
    path.chmod(0o711)  # the stack's RabbitMQ runs as the rabbitmq user and must reach its dir
    yield path
    if not os.environ.get("PODWIRE_KEEP_TEST_DIR"):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def stack(work_dir: Path) -> Iterator[dict[str, Any]]:
    """The session's stack, with its RPC bus (RabbitMQ + neutron-rpc-server) for Neutron's
    agents: the broker boots while the rest starts, so it adds little to the start-up."""
    proc, info = start_stack(work_dir / "stack", extra=("--rpc", "--deployments", DEPLOYMENTS))
    yield info
    stop_stack(proc)


@pytest.fixture(scope="session")
def kube_stack(work_dir: Path) -> Iterator[dict[str, Any]]:
    """A stack with ``--kubernetes`` (kube-apiserver, kube-controller-manager and
    kube-scheduler with etcd, MariaDB and Neutron) in a data dir of its own: the session's stack
    stays as fast as it was for the tests that need no Kubernetes. Fails at once, naming
    scripts/setup, if the binaries were never built. Shared by tests/stack and tests/deploy.
    With the RPC bus: the Services tests route pods to the apiserver through Neutron's L3
    agent."""
    kube_control.check_binaries(kube_control.default_bin_dir())
    proc, info = start_stack(work_dir / "kube-stack", extra=("--kubernetes", "--rpc"))
    yield info
    stop_stack(proc)


@pytest.fixture(scope="session")
def etcd_settings(stack: dict[str, Any]) -> EtcdSettings:
    return EtcdSettings(endpoints=[stack["etcd"]])


@pytest.fixture(scope="session")
async def etcd(etcd_settings: EtcdSettings) -> AsyncIterator[EtcdClient]:
    client = await EtcdClient.connect(etcd_settings)
    yield client
    await client.close()


@pytest.fixture
async def prefix(etcd: EtcdClient) -> AsyncIterator[str]:
    """A key prefix of this test's own, emptied afterwards."""
    value = f"/podwire-test/{uuid.uuid4().hex}/"
    yield value
    await delete_prefix(etcd, value)


@pytest.fixture(scope="session")
def neutron_endpoint(stack: dict[str, Any]) -> str:
    return str(stack["neutron"])


@pytest.fixture(scope="session")
def neutron(neutron_endpoint: str) -> Any:
    return neutron_connection(neutron_endpoint)


def delete_project_resources(neutron: Any, project: str) -> None:
    """A project's floating IPs, routers, trunks, ports and networks, in an order Neutron
    accepts."""
    delete_routers(neutron, project)
    net = neutron.network
    for trunk in list(net.trunks(project_id=project)):
        net.delete_trunk(trunk)
    for port in list(net.ports(project_id=project)):
        net.delete_port(port)
    for network in list(net.networks(project_id=project)):
        net.delete_network(network)


@pytest.fixture
def project_id(neutron: Any) -> Iterator[str]:
    """A Neutron project of this test's own; its floating IPs, routers, ports, trunks and
    networks go afterwards."""
    project = uuid.uuid4().hex
    yield project
    delete_project_resources(neutron, project)
