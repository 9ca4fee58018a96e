"""Namespaces as networks on a real kubelet: the pods of a namespace annotated
``podwire.io/network: auto`` get their addresses from the subnet podwire made for it (from the
subnet pool, on the cluster router) although the node's CNI config names another network,
and ping each other; the namespace deleted, its pods go, then the network, its subnet and the
router interface, then the namespace.

The controller (``[kubernetes]`` with a subnet pool and a router of the cluster's project) and
the agent run as processes (``podwire.demo.services``); kubelet is the real one of a kube-node.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
from typing import Any

import pytest

from podwire.demo.services import Services
from podwire.neutron.ns_networks import NAME_PREFIX
from tests.kube.conftest import SUBNET, Cluster, _namespace, pod_manifest
from tests.kube.test_pool import NodeAgent
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns, pytest.mark.slow]

HOST_INDEX = 10
POOL_PREFIX = "10.150.0.0/16"
PODS = ("ns-a", "ns-b")


async def _running(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    async def phase() -> dict[str, Any] | None:
        pod = await cluster.kubectl.get("pod", "-n", namespace, name)
        return pod if pod and pod["status"].get("phase") == "Running" else None

    try:
        return await eventually(phase, f"pod {namespace}/{name} Running", 120)
    except AssertionError as exc:
        described = await cluster.kubectl.run("describe", "pod", "-n", namespace, name)
        raise AssertionError(f"{exc}\n{described[-3000:]}") from None


def _router_interfaces(cluster: Cluster, router_id: str) -> list[Any]:
    return list(
        cluster.neutron.network.ports(device_id=router_id, device_owner="network:router_interface")
    )


def _made(cluster: Cluster, pool_id: str) -> tuple[list[Any], list[Any]]:
    """The subnets taken from the pool, and the networks podwire made for namespaces."""
    net = cluster.neutron.network
    project = cluster.network.project_id
    subnets = [s for s in net.subnets(project_id=project) if s.subnet_pool_id == pool_id]
    networks = [
        n
        for n in net.networks(project_id=project)
        if str(n.name).startswith(NAME_PREFIX + cluster.namespace)
    ]
    return subnets, networks


def _clean_neutron(cluster: Cluster, pool_id: str, router_id: str) -> None:
    """What a failed run left: the router's interfaces, the router, the namespaces'
    networks, the pool (in that order: Neutron keeps what another object uses)."""
    net = cluster.neutron.network
    for port in _router_interfaces(cluster, router_id):
        net.remove_interface_from_router(router_id, port_id=port.id)
    net.delete_router(router_id, ignore_missing=True)
    for network in _made(cluster, pool_id)[1]:
        for port in list(net.ports(network_id=network.id)):
            net.delete_port(port)
        net.delete_network(network)
    net.delete_subnet_pool(pool_id, ignore_missing=True)


async def test_an_auto_namespace_s_pods_share_its_subnet_and_it_goes_with_them(
    cluster: Cluster,
) -> None:
    netns, vtep = cluster.netenv.host(cluster.address_base + HOST_INDEX)
    host = cluster.host_name(HOST_INDEX)
    project = cluster.network.project_id
    net = cluster.neutron.network
    pool = net.create_subnet_pool(
        name=f"pw-ns-{cluster.namespace}", project_id=project, prefixes=[POOL_PREFIX],
        default_prefixlen=26,
    )  # fmt: skip
    router = net.create_router(name=f"pw-ns-{cluster.namespace}", project_id=project)
    services = Services(cluster.work / "ns-networks", cluster.info["etcd"], cluster.info["neutron"])
    services.work.mkdir()
    kubernetes = (
        f'[kubernetes]\nkubeconfig = "{cluster.info["kubeconfig"]}"\n'
        f'project_id = "{project}"\nsubnet_pool = "{pool.id}"\n'
        f'cluster_router = "{router.id}"\n'
    )
    name = f"{cluster.namespace}-auto"
    kubectl = cluster.kubectl
    node = None

    async def namespace_gone() -> bool:
        return await kubectl.get("namespace", name) is None

    try:
        await asyncio.to_thread(services.start_controller, [host], kubernetes)
        socket = await asyncio.to_thread(services.start_agent, host, netns, vtep)
        node = await cluster.start_node(NodeAgent(host, netns, socket))  # type: ignore[arg-type]
        await _namespace(kubectl, name)
        await kubectl.run("annotate", "namespace", name, "podwire.io/network=auto")
        for pod in PODS:
            manifest = pod_manifest(cluster, pod, host)
            manifest["metadata"]["namespace"] = name
            await kubectl.run("apply", "-f", "-", stdin=json.dumps(manifest))
        addresses = [
            (await _running(cluster, name, pod))["status"]["podIP"] for pod in PODS
        ]  # fmt: skip

        subnets, networks = await asyncio.to_thread(_made, cluster, pool.id)
        assert len(subnets) == 1 and len(networks) == 1, (subnets, networks)
        cidr = ipaddress.ip_network(subnets[0].cidr)
        assert cidr.subnet_of(ipaddress.IPv4Network(POOL_PREFIX))  # type: ignore[arg-type]
        for address in addresses:
            assert ipaddress.ip_address(address) in cidr, (address, cidr)
        assert ipaddress.ip_address(addresses[0]) not in ipaddress.ip_network(SUBNET)
        interfaces = await asyncio.to_thread(_router_interfaces, cluster, router.id)
        assert [p.network_id for p in interfaces] == [networks[0].id]

        last = [""]

        async def answered() -> bool:
            last[0] = await kubectl.run(
                "exec", "-n", name, PODS[0], "--", "ping", "-c", "1", "-W", "1", addresses[1],
                check=False,
            )  # fmt: skip
            return " 0% packet loss" in last[0]

        try:
            await eventually(answered, f"{PODS[0]} pings {addresses[1]}", 30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{last[0]}") from None

        await kubectl.run("delete", "namespace", name, "--wait=false")
        await eventually(namespace_gone, f"namespace {name} gone", 120)
        subnets, networks = await asyncio.to_thread(_made, cluster, pool.id)
        assert (subnets, networks) == ([], [])
        assert await asyncio.to_thread(_router_interfaces, cluster, router.id) == []
    finally:
        if await kubectl.get("namespace", name) is not None:
            await kubectl.run("delete", "namespace", name, "--wait=false", check=False)
            with contextlib.suppress(AssertionError):
                await eventually(namespace_gone, f"namespace {name} gone", 60)
            # Never leave a namespace the stopped controller would hold forever.
            await kubectl.run("patch", "namespace", name, "--type=json", "-p",
                              '[{"op": "remove", "path": "/metadata/finalizers"}]',
                              check=False)  # fmt: skip
        if node is not None:
            assert await cluster.retire(node) == 0
        if services.children.get("controller"):
            await asyncio.to_thread(services.admin, "POST", "/v1/pools/free", {"nodes": [host]})
        await asyncio.to_thread(services.stop)
        await asyncio.to_thread(_clean_neutron, cluster, pool.id, router.id)
