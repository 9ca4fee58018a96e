"""An endpoint change from the Kubernetes API to the pods' tables: ``SERVICES`` selector-less
Services with hand-made EndpointSlices (the apiserver's own ``kubernetes`` Service is one)
in the stack's kube-apiserver; the controller with ``[kubernetes]`` in this process (its
informers, its compiler, its fenced etcd writes); the agent's ``PodServices`` with pod
namespaces of their own. A sample: one slice's endpoint replaced with a JSON patch, until
every pod's table holds the new address."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from kubernetes_asyncio import client as kube_client

from bench.controllers import QUIET_POOL, controller_settings, register_node, serving_controller
from bench.harness import forget_nodes, kube_api, running, stack_etcd, until
from bench.stats import row
from podwire import keys
from podwire.agent.services.pods import PodServices
from podwire.config import KubernetesSettings
from podwire.etcd import EtcdClient
from podwire.schema.checkpoints import Attached, Attachment
from podwire.schema.vif import Vif
from tests.agent.netenv import sh
from tests.agent.service_tables import holds

NETWORK = "6d1f0c2a-0000-4000-8000-00000000beef"  # the bench pods' network
CREATING = 20  # API requests in flight while the Services are made
PORT = 8080
POLL = 0.0005  # seconds between looks at the pods' tables


async def run(
    stack: dict[str, Any], services: int, endpoints: int, pods: int, changes: int
) -> list[dict[str, Any]]:
    etcd = await stack_etcd(stack)
    api = await kube_api(stack["kubeconfig"])
    namespace = f"pwb-svcapi-{uuid.uuid4().hex[:6]}"
    node = f"{namespace}-node"
    try:
        with pods_attached(pods) as attached:
            core, discovery = kube_client.CoreV1Api(api), kube_client.DiscoveryV1Api(api)
            await core.create_namespace({"metadata": {"name": namespace}})
            await _make(core, discovery, namespace, services, endpoints)
            await register_node(etcd, node)
            project = uuid.uuid4().hex
            kubernetes = KubernetesSettings(kubeconfig=stack["kubeconfig"], project_id=project)
            settings = controller_settings(stack, {node: node}, QUIET_POOL)
            async with serving_controller(replace(settings, kubernetes=kubernetes), etcd):
                took = await _changes(etcd, discovery, namespace, attached, services, changes)
    finally:
        await kube_client.CoreV1Api(api).delete_namespace(namespace)
        await api.close()
        await forget_nodes(etcd, node)
        await etcd.close()
    name = (
        f"Service: EndpointSlice patched in the API -> in force in {pods} pods' tables,"
        f" {services} Services x {endpoints} endpoints (controller + agent)"
    )
    return [row(name, took)]


async def _make(core: Any, discovery: Any, namespace: str, count: int, endpoints: int) -> None:
    slots = asyncio.Semaphore(CREATING)

    async def one(index: int) -> None:
        async with slots:
            service = {
                "metadata": {"name": f"s{index}"},
                "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": 80}]},
            }
            await core.create_namespaced_service(namespace, service)
            await discovery.create_namespaced_endpoint_slice(
                namespace, _slice(index, range(endpoints))
            )

    await asyncio.gather(*(one(i) for i in range(count)))


def _slice(index: int, endpoints: range) -> dict[str, Any]:
    return {
        "metadata": {"name": f"s{index}", "labels": {"kubernetes.io/service-name": f"s{index}"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [endpoint_address(index, n)]} for n in endpoints],
        "ports": [{"name": "http", "protocol": "TCP", "port": PORT}],
    }


def endpoint_address(index: int, n: int) -> str:
    """The ``n``-th endpoint of Service ``index``: distinct for every pair the benches use."""
    return f"10.{100 + n // 250 % 100}.{n % 250}.{1 + index % 250}"


async def _changes(
    etcd: EtcdClient,
    discovery: Any,
    namespace: str,
    pods: dict[str, Attachment],
    services: int,
    changes: int,
) -> list[float]:
    follower = PodServices(etcd, lambda: pods)

    def published(attachment: str) -> int:
        held = holds(follower, attachment)
        return sum(1 for key in held if key.startswith(keys.services_prefix() + namespace))

    try:
        async with running(follower.run()):
            await until(lambda: all(published(a) == services for a in pods), 300, POLL)
            took = []
            for change in range(changes):
                index = change % services
                address = endpoint_address(index, 1000 + change)
                patch = [{"op": "replace", "path": "/endpoints/0/addresses/0", "value": address}]
                key = keys.service(namespace, f"s{index}")
                started = time.perf_counter()
                await discovery.patch_namespaced_endpoint_slice(
                    f"s{index}", namespace, patch, _content_type="application/json-patch+json"
                )
                await until(
                    lambda k=key, x=address: all(_holds(follower, a, k, x) for a in pods),
                    120,
                    POLL,
                )
                took.append((time.perf_counter() - started) * 1000)
            return took
    finally:
        follower.close()


def _holds(follower: PodServices, attachment: str, key: str, address: str) -> bool:
    held = holds(follower, attachment).get(key)
    return held is not None and any(
        backend[0] == address for port in held.ports for backend in port.backends
    )


@contextlib.contextmanager
def pods_attached(count: int) -> Iterator[dict[str, Attachment]]:
    """``count`` pods' attachments, each pod with a network namespace of its own."""
    tag = uuid.uuid4().hex[:6]
    found = {}
    for index in range(count):
        attachment = f"pwb{tag}{index}:eth0"
        vif = Vif(f"port-{index}", NETWORK, "project", "02:00:00:00:00:01", 1450, [])
        attached = Attached("h", "02:00:00:00:00:02", "eth0", "02:00:00:00:00:01", 1450, "", ())
        netns = f"/run/netns/pwb-svc-p-{tag}-{index}"
        found[attachment] = Attachment(
            attachment, f"pwb{tag}{index}", "eth0", "bench", netns, None, vif, attached
        )
    try:
        for pod in found.values():
            sh("ip", "netns", "add", pod.netns.rsplit("/", 1)[1])
        yield found
    finally:
        for pod in found.values():
            sh("ip", "netns", "del", pod.netns.rsplit("/", 1)[1], check=False)
