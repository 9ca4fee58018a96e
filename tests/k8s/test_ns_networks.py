"""Namespaces as networks on the kube stack's real apiserver, etcd and Neutron, with scripted
nodes: an ``auto`` namespace gets a network of its own (a subnet from the subnet pool, on the
cluster router) and a finalizer; its pods' ports are taken from it; deleted, the namespace
waits for its pods and their ports, then network, subnet and interface go, and so does the
namespace, also when the controller that made the network is gone and another takes over.
A namespace naming a missing network, or a malformed value, has its pods refused as
retryable, naming the namespace and the value, and converges once the annotation is fixed."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire.config import Settings
from podwire.k8s.ns_network import FINALIZER
from podwire.neutron.client import neutron_connection
from podwire.neutron.ns_networks import namespace_mark
from podwire.neutron.routers import delete_routers
from podwire.schema.inuse import PoolKey
from tests.controller.conftest import ScriptedNodes, make_network, request_vif
from tests.k8s.test_apiserver import apply, pod
from tests.k8s.test_events import events_of
from tests.k8s.test_gone_pods import pod_request, records
from tests.k8s.test_leader_kubernetes import (  # noqa: F401  (the fixtures)
    Start,
    controller_url,
    kube_etcd,
    lead,
    scripted,
    settings,
    start,
)
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl

pytestmark = [pytest.mark.stack, pytest.mark.slow]

POOL_PREFIX = "10.140.0.0/16"


@pytest.fixture
def project(kube_stack: dict[str, Any]) -> Iterator[str]:
    """A project of this test's own with a subnet pool and a router; everything in it goes
    afterwards (router interfaces first: Neutron keeps a network a router is on)."""
    project_id = uuid.uuid4().hex
    yield project_id
    net = neutron_connection(kube_stack["neutron"]).network
    delete_routers(neutron_connection(kube_stack["neutron"]), project_id)
    for port in list(net.ports(project_id=project_id)):
        net.delete_port(port)
    for network in list(net.networks(project_id=project_id)):
        net.delete_network(network)
    for pool in list(net.subnet_pools(project_id=project_id)):
        net.delete_subnet_pool(pool)
    for group in list(net.security_groups(project_id=project_id)):
        net.delete_security_group(group)


def auto_settings(kube_stack: dict[str, Any], project: str, nodes: list[Any]) -> Settings:
    net = neutron_connection(kube_stack["neutron"]).network
    pool = net.create_subnet_pool(
        name="pw-ns-pool", project_id=project, prefixes=[POOL_PREFIX], default_prefixlen=26
    )
    router = net.create_router(name="pw-ns-router", project_id=project)
    base = settings(kube_stack, nodes, project, kube_stack["kubeconfig"])
    return replace(
        base,
        kubernetes=replace(base.kubernetes, subnet_pool=pool.id, cluster_router=router.id),
    )


def namespace(name: str, network: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "annotations": {"podwire.io/network": network}},
    }


def namespace_json(kube_stack: dict[str, Any], name: str) -> dict[str, Any] | None:
    done = kubectl(kube_stack, "get", "namespace", name, "-o=json")
    if done.returncode != 0:
        assert "NotFound" in done.stderr, done.stderr
        return None
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def made(neutron: Any, project: str, uid: str) -> tuple[Any, list[Any], list[Any]] | None:
    """The namespace's network, its subnets and the router's ports on it."""
    net = neutron.network
    found = list(net.networks(project_id=project, tags=namespace_mark(uid)))
    if not found:
        return None
    subnets = list(net.subnets(network_id=found[0].id))
    interfaces = list(net.ports(network_id=found[0].id, device_owner="network:router_interface"))
    return found[0], subnets, interfaces


def logged(caplog: Any, event: str, namespace_name: str) -> bool:
    return any(
        r.getMessage() == event and r.fields.get("namespace") == namespace_name
        for r in caplog.records
        if hasattr(r, "fields")
    )


async def test_an_auto_namespace_gets_its_network_and_loses_it_with_the_namespace(
    kube_stack: dict[str, Any],
    kube_etcd: Any,  # noqa: F811
    scripted: ScriptedNodes,  # noqa: F811
    project: str,
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    default = make_network(neutron, project, "pw-ns-default", "10.141.0.0/24")
    config = auto_settings(kube_stack, project, [node])
    first, task = await lead(config, kube_etcd)
    name = f"ns-{uuid.uuid4().hex[:8]}"
    try:
        await apply(kube_stack, tmp_path, namespace(name, "auto"), pod(name, "a", {"app": "a"}))
        uid = (namespace_json(kube_stack, name) or {})["metadata"]["uid"]

        async def ready() -> tuple[Any, list[Any], list[Any]] | None:
            found = await asyncio.to_thread(made, neutron, project, uid)
            return found if found and found[1] and found[2] else None

        network, subnets, interfaces = await eventually(ready, "the namespace's network")
        assert len(subnets) == 1 and len(interfaces) == 1
        assert str(subnets[0].subnet_pool_id) == config.kubernetes.subnet_pool
        assert ipaddress.IPv4Network(subnets[0].cidr).subnet_of(ipaddress.IPv4Network(POOL_PREFIX))
        assert interfaces[0].device_id == config.kubernetes.cluster_router
        assert FINALIZER in (namespace_json(kube_stack, name) or {})["metadata"]["finalizers"]
        # Its pools warm up as the namespace appears (settings_for: 2 ports a pool).
        key = PoolKey(node.name, project, network.id)

        async def warm() -> bool:
            return first.service.pool_size(key) >= 2  # type: ignore[no-any-return]

        await eventually(warm, "the namespace network's pool filled")

        async with aiohttp.ClientSession() as http:
            # The request names the node's network: the namespace's is used instead.
            request = pod_request(kube_stack, default, name, "a")
            status, answer = await request_vif(http, controller_url(first), node, request)
            assert status == 200, answer
            vif = answer["vif"]
            assert vif["network_id"] == network.id, vif
            address = ipaddress.ip_address(vif["fixed_ips"][0]["ip_address"])
            assert address in ipaddress.ip_network(subnets[0].cidr)

        # The controller goes; meanwhile the namespace is deleted, its pod with it. The
        # finalizer holds the namespace, the port is still recorded, the network stays.
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")

        async def pod_gone() -> bool:
            done = kubectl(kube_stack, "get", "pods", "-n", name, "-o=name")
            return done.returncode == 0 and not done.stdout.strip()

        await eventually(pod_gone, "the namespace's pod deleted", timeout=60)
        assert (namespace_json(kube_stack, name) or {})["metadata"].get("deletionTimestamp")
        assert await records(kube_etcd, node.name) == {"a:eth0"}
        assert await asyncio.to_thread(made, neutron, project, uid) is not None

        # The next controller resumes: the gone pod's port released, then the network.
        await start(config)

        async def gone() -> bool:
            return namespace_json(kube_stack, name) is None

        await eventually(gone, "the namespace deleted", timeout=60)
        assert await asyncio.to_thread(made, neutron, project, uid) is None
        assert neutron.network.find_network(network.id) is None
        assert neutron.network.find_subnet(subnets[0].id) is None
        assert neutron.network.find_port(interfaces[0].id) is None
    finally:
        if not task.done():
            task.cancel()
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


async def test_a_namespace_naming_a_missing_or_malformed_network_is_refused_until_fixed(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,
    start: Start,  # noqa: F811
    tmp_path: Path,
    caplog: Any,
) -> None:
    caplog.set_level(logging.INFO)
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    default = make_network(neutron, project, "pw-ns-node", "10.142.0.0/24")
    named = make_network(neutron, project, "pw-ns-named", "10.143.0.0/24")
    controller = await start(settings(kube_stack, [node], project, kube_stack["kubeconfig"]))
    missing, bad = str(uuid.uuid4()), "Not A Network"
    first, second = f"ns-{uuid.uuid4().hex[:8]}", f"ns-{uuid.uuid4().hex[:8]}"
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace(first, missing),
            namespace(second, bad),
            pod(first, "p", {"app": "p"}),
            pod(second, "p", {"app": "p"}),
        )
        async with aiohttp.ClientSession() as http:
            url = controller_url(controller)
            for ns, named_value in ((first, missing), (second, bad)):
                status, refused = await request_vif(
                    http, url, node, pod_request(kube_stack, default, ns, "p")
                )
                assert (status, refused["cause"], refused["retryable"]) == (
                    503,
                    "namespace_network",
                    True,
                ), refused
                assert f"namespace {ns}" in refused["error"], refused
                assert named_value in refused["error"], refused

            for ns, named_value in ((first, missing), (second, bad)):
                assert logged(caplog, "controller.namespace_network.problem", ns)

                async def told(ns: str = ns, value: str = named_value) -> bool:
                    # A cluster-scoped object's Events are kept in "default".
                    return any(
                        e["involvedObject"].get("kind") == "Namespace"
                        and e["involvedObject"]["name"] == ns
                        and e["reason"] == "NetworkRefused"
                        and value in e["message"]
                        for e in await asyncio.to_thread(events_of, kube_stack, "default")
                    )

                await eventually(told, f"the Event on namespace {ns}")
            # Fixed: the one names a network that exists, the other has no annotation.
            kubectl(kube_stack, "annotate", "namespace", first, "--overwrite",
                    f"podwire.io/network={named.id}")  # fmt: skip
            kubectl(kube_stack, "annotate", "namespace", second, "podwire.io/network-")

            async def served(ns: str) -> dict[str, Any] | None:
                request = pod_request(kube_stack, default, ns, "p")
                request["attachment"] = f"{ns}:eth0"
                status, answer = await request_vif(http, url, node, request)
                return answer["vif"] if status == 200 else None

            fixed = await eventually(lambda: served(first), "the fixed namespace's pod served")
            assert fixed["network_id"] == named.id
            plain = await eventually(lambda: served(second), "the plain namespace's pod served")
            assert plain["network_id"] == default.id
            # No auto network without the settings: nothing made, no finalizer.
            for ns in (first, second):
                assert FINALIZER not in (
                    (namespace_json(kube_stack, ns) or {})["metadata"].get("finalizers") or []
                )
    finally:
        for ns in (first, second):
            kubectl(kube_stack, "delete", "namespace", ns, "--wait=false")
