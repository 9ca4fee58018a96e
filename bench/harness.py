"""What several benches do around their measurements, written once: a project's network in
Neutron and its removal, nodes forgotten in etcd, a component running for a block, polling
until a condition holds, a port bound until ACTIVE, iperf3 between namespaces, a Kubernetes
API client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

from kubernetes_asyncio import client as kube_client
from kubernetes_asyncio import config as kube_config

from podwire import keys
from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from tests.agent.netenv import in_ns
from tests.conftest import delete_project_resources
from tests.etcd_tools import delete_prefix


async def stack_etcd(stack: dict[str, Any]) -> EtcdClient:
    return await EtcdClient.connect(EtcdSettings(endpoints=[stack["etcd"]]))


def project_network(
    conn: Any, project: str, name: str, cidr: str, dhcp: bool = True
) -> tuple[Any, Any]:
    """A network of ``project`` and its one IPv4 subnet (without ``dhcp``, Neutron makes no
    port of its own there)."""
    network = conn.network.create_network(name=name, project_id=project)
    subnet = conn.network.create_subnet(
        network_id=network.id, cidr=cidr, ip_version=4, project_id=project, enable_dhcp=dhcp
    )
    return network, subnet


def delete_project(conn: Any, project: str) -> None:
    """Whatever a bench made in ``project``: its ports and networks, then its groups."""
    delete_project_resources(conn, project)
    for group in list(conn.network.security_groups(project_id=project)):
        conn.network.delete_security_group(group)
    for address_group in list(conn.network.address_groups(project_id=project)):
        conn.network.delete_address_group(address_group)


async def forget_nodes(etcd: EtcdClient, *hosts: str) -> None:
    """Every key of these nodes: desired ports, their own state, in-use records."""
    for host in hosts:
        await delete_prefix(etcd, keys.node_prefix(host))
        await delete_prefix(etcd, keys.state_node_prefix(host))
        await delete_prefix(etcd, keys.vifs_prefix(host))


@contextlib.asynccontextmanager
async def running(work: Coroutine[Any, Any, Any]) -> AsyncIterator[asyncio.Task[Any]]:
    """``work`` as a task of this event loop for the block; cancelled after it."""
    task = asyncio.create_task(work)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(
    check: Callable[..., object], within: float, poll: float, thread: bool = False, what: str = ""
) -> float:
    """Poll ``check`` (in a thread with ``thread``: it blocks) until it holds; the monotonic
    time it was first seen to."""
    deadline = time.monotonic() + within
    while not (await asyncio.to_thread(check) if thread else check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what or 'the awaited state'}: not within {within:.0f} s")
        await asyncio.sleep(poll)
    return time.monotonic()


def wait_for(check: Callable[[], Any], within: float, poll: float, what: str = "") -> Any:
    """Poll ``check`` until it returns something true, and return that."""
    deadline = time.monotonic() + within
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what or 'the awaited state'}: not within {within:.0f} s")
        time.sleep(poll)
    return found


def bind_to_active(
    conn: Any, network_id: str, project: str, host: str, give_up: float
) -> tuple[Any, float]:
    """A new port bound to ``host``: (the port, ms from the binding update until Neutron
    shows it ACTIVE, polled every 10 ms)."""
    port = conn.network.create_port(
        network_id=network_id, project_id=project, device_owner="compute:podwire"
    )
    started = time.perf_counter()
    conn.network.update_port(port.id, binding_host_id=host)
    while conn.network.get_port(port.id).status != "ACTIVE":
        if time.perf_counter() - started > give_up:
            raise RuntimeError(f"port {port.id} not ACTIVE on {host} after {give_up:.0f} s")
        time.sleep(0.01)
    return port, (time.perf_counter() - started) * 1000


async def kube_api(kubeconfig: str) -> Any:
    """A Kubernetes API client as the stack's admin."""
    configuration = kube_client.Configuration()
    await kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return kube_client.ApiClient(configuration)


@contextlib.contextmanager
def iperf_server(ns: str) -> Iterator[None]:
    """``iperf3 -s`` in ``ns`` for the block, given half a second to listen first."""
    argv = ["ip", "netns", "exec", ns, "iperf3", "-s"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def iperf(ns: str, address: str) -> float:
    """Gbit/s an iperf3 client in ``ns`` gets through to ``address`` in 3 s (its server up)."""
    done = in_ns(ns, "iperf3", "-c", address, "-t", "3", "-J")
    return float(json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"]) / 1e9
