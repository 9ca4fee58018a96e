"""Pods through the API on a node served from the controller's pools: a pod made with kubectl
takes a pooled port (bound and ACTIVE before the pod existed), the port goes back to the pool
when the pod is deleted, and the next pod takes a pooled port again (a pool hit).

The controller and the agent run as processes, configured as an operator would
(``podwire.demo.services``), on the session's stack; kubelet is the real one of a kube-node.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from podwire.demo.services import Services
from tests.kube.conftest import Cluster
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns]

HOST_INDEX = 7
POOLED = 3


@dataclass(frozen=True)
class NodeAgent:
    """What kube-node needs of the host's agent."""

    host: str
    netns: str
    socket: str


def _pooled(services: Services) -> set[str]:
    pools = services.admin("GET", "/v1/pools")["pools"]
    return {port for pool in pools for group in pool["groups"] for port in group["ports"]}


async def _port_of_ip(cluster: Cluster, address: str) -> Any:
    ports = await asyncio.to_thread(cluster.ports)
    found = [p for p in ports if any(ip["ip_address"] == address for ip in p.fixed_ips)]
    assert len(found) == 1, f"{len(found)} ports with {address}"
    return found[0]


async def _pod_port(cluster: Cluster, name: str, host: str) -> Any:
    pod = await cluster.running(name)
    port = await _port_of_ip(cluster, pod["status"]["podIP"])
    assert port.binding_host_id == host and port.status == "ACTIVE"
    return port


async def test_pods_through_the_api_take_pooled_ports_and_give_them_back(
    cluster: Cluster,
) -> None:
    netns, vtep = cluster.netenv.host(cluster.address_base + HOST_INDEX)
    host = cluster.host_name(HOST_INDEX)
    services = Services(cluster.work / "pooled", cluster.info["etcd"], cluster.info["neutron"])
    services.work.mkdir()
    node = None
    try:
        await asyncio.to_thread(services.start_controller, [host])
        socket = await asyncio.to_thread(services.start_agent, host, netns, vtep)
        body = {
            "nodes": [host],
            "network": cluster.network.id,
            "project_id": cluster.network.project_id,
            "count": POOLED,
        }
        await asyncio.to_thread(services.admin, "POST", "/v1/pools/populate", body)
        node = await cluster.start_node(NodeAgent(host, netns, socket))  # type: ignore[arg-type]
        before = await asyncio.to_thread(_pooled, services)
        assert len(before) == POOLED

        await cluster.create_pod("pool-a", host)
        first = await _pod_port(cluster, "pool-a", host)
        assert first.id in before  # taken from the pool, not made for the pod
        await cluster.delete_pod("pool-a")
        await cluster.gone("pool-a")

        async def returned() -> bool:
            return first.id in await asyncio.to_thread(_pooled, services)

        await eventually(returned, "the deleted pod's port back in its pool", 30)

        ready = await asyncio.to_thread(_pooled, services)
        await cluster.create_pod("pool-b", host)
        second = await _pod_port(cluster, "pool-b", host)
        assert second.id in ready  # a pool hit again
        hits = await asyncio.to_thread(services.metric, "podwire_pool_hits_total")
        assert hits >= 2
        await cluster.delete_pod("pool-b")
        await cluster.gone("pool-b")
    finally:
        if node is not None:
            assert await cluster.retire(node) == 0
        for pod in ("pool-a", "pool-b"):
            await cluster.delete_pod(pod, "--grace-period=0", "--force", "--ignore-not-found")
        if services.children.get("controller"):
            await asyncio.to_thread(services.admin, "POST", "/v1/pools/free", {"nodes": [host]})
        await asyncio.to_thread(services.stop)
