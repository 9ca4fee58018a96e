"""The Kubernetes API as the truth for cleanup, on the kube stack's real apiserver, etcd and
Neutron: a pod deleted from the API while no agent releases its port (these nodes have none)
has its port released by the controller once it has been gone for the grace, and deleted
rather than pooled (no agent unplugged it), while one whose node's DEL came within the grace
is pooled again; a controller started after pods were deleted while none ran releases their
ports and keeps those of the pods that exist (a new pod of a gone pod's name does not keep
it); records of no pod, or of a pod named without uid, are never judged."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from podwire import keys
from podwire.config import Settings
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import neutron_connection
from tests.controller.conftest import ScriptedNodes, make_network, release_vif, request_vif
from tests.k8s.objects import namespace_manifest
from tests.k8s.test_apiserver import apply, pod
from tests.k8s.test_leader_kubernetes import (  # noqa: F401  (the fixtures)
    Start,
    body,
    controller_url,
    kube_etcd,
    lead,
    project,
    scripted,
    settings,
    start,
    uid_of,
)
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl

GRACE = 3.0  # seconds a gone pod's port waits for its node's DEL


def graced(config: Settings, grace: float) -> Settings:
    return replace(config, kubernetes=replace(config.kubernetes, gone_pod_grace=grace))


def pod_request(
    kube_stack: dict[str, Any], network: Any, namespace: str, name: str, uid: bool = True
) -> dict[str, Any]:
    request = body(network)
    request["attachment"] = f"{name}:eth0"
    found = uid_of(kube_stack, namespace, name) if uid else ""
    request["pod"] = {"namespace": namespace, "name": name, "uid": found}
    return request


def delete_pod(kube_stack: dict[str, Any], namespace: str, name: str) -> None:
    done = kubectl(kube_stack, "delete", "pod", "-n", namespace, name, "--wait=true")
    assert done.returncode == 0, done.stderr


async def port_gone(neutron: Any, port_id: str) -> bool:
    """The record goes first, then the port (the release path's order)."""
    return await asyncio.to_thread(neutron.network.find_port, port_id) is None


async def records(etcd: EtcdClient, node: str) -> set[str]:
    items, _ = await etcd.get_prefix(keys.vifs_prefix(node))
    return {item.key.rsplit("/", 1)[1] for item in items}


async def test_a_pod_deleted_from_the_api_has_its_port_released(
    kube_stack: dict[str, Any],
    kube_etcd: EtcdClient,  # noqa: F811
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = await scripted.add()
    network = make_network(
        neutron_connection(kube_stack["neutron"]), project, "pw-gone", "10.83.0.0/24"
    )
    config = settings(kube_stack, [node], project, kube_stack["kubeconfig"])
    controller = await start(graced(config, GRACE))
    url = controller_url(controller)
    name = f"gone-{uuid.uuid4().hex[:8]}"
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
            pod(name, "stays", {"app": "web"}),
            pod(name, "unnamed", {"app": "web"}),
            pod(name, "unplugged", {"app": "web"}),
        )
        async with aiohttp.ClientSession() as http:
            ports = {}
            pods = (("web", True), ("stays", True), ("unnamed", False), ("unplugged", True))
            for pod_name, uid in pods:
                request = pod_request(kube_stack, network, name, pod_name, uid)
                status, answer = await request_vif(http, url, node, request)
                assert status == 200, answer
                ports[pod_name] = answer["vif"]["port_id"]
            status, answer = await request_vif(http, url, node, body(network))  # no pod
            assert status == 200, answer
        assert await records(kube_etcd, node.name) == {
            "web:eth0",
            "stays:eth0",
            "unnamed:eth0",
            "unplugged:eth0",
            "k1:eth0",
        }

        delete_pod(kube_stack, name, "web")
        delete_pod(kube_stack, name, "unnamed")
        # Gone from the API, then its node's DEL within the grace, as kubelet does it.
        delete_pod(kube_stack, name, "unplugged")
        async with aiohttp.ClientSession() as http:
            assert await release_vif(http, url, node, "unplugged:eth0") == 204

        async def released() -> bool:
            return await records(kube_etcd, node.name) == {"stays:eth0", "unnamed:eth0", "k1:eth0"}

        await eventually(released, "the deleted pod's record gone", timeout=30)
        attachments = controller.service.attachments
        assert (node.name, "web:eth0") not in attachments
        # Its port is deleted, not pooled: no agent unplugged it. The others' stay.
        neutron = neutron_connection(kube_stack["neutron"])
        await eventually(lambda: port_gone(neutron, ports["web"]), "its port deleted")
        assert not controller.service.pools.known(ports["web"])
        assert neutron.network.find_port(ports["stays"]) is not None
        assert neutron.network.find_port(ports["unnamed"]) is not None
        # The pod its node unplugged within the grace: its port back in the pool.
        assert controller.service.pools.known(ports["unplugged"])
        assert neutron.network.find_port(ports["unplugged"]) is not None
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


async def test_a_controller_started_after_pods_went_releases_their_ports_only(
    kube_stack: dict[str, Any],
    kube_etcd: EtcdClient,  # noqa: F811
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = await scripted.add()
    network = make_network(
        neutron_connection(kube_stack["neutron"]), project, "pw-gone2", "10.84.0.0/24"
    )
    config = graced(settings(kube_stack, [node], project, kube_stack["kubeconfig"]), 0.0)
    name = f"gone-{uuid.uuid4().hex[:8]}"
    first, task = await lead(config, kube_etcd)
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "kept", {"app": "a"}),
            pod(name, "went", {"app": "b"}),
        )
        async with aiohttp.ClientSession() as http:
            ports = {}
            for pod_name in ("kept", "went"):
                request = pod_request(kube_stack, network, name, pod_name)
                status, answer = await request_vif(http, controller_url(first), node, request)
                assert status == 200, answer
                ports[pod_name] = answer["vif"]["port_id"]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # While no controller runs: one pod goes, and a new pod takes its name (another uid).
        delete_pod(kube_stack, name, "went")
        await apply(kube_stack, tmp_path, pod(name, "went", {"app": "b"}))
        assert await records(kube_etcd, node.name) == {"kept:eth0", "went:eth0"}

        second = await start(config)

        async def released() -> bool:
            return await records(kube_etcd, node.name) == {"kept:eth0"}

        await eventually(released, "the gone pod's record released", timeout=30)
        assert set(second.service.attachments) == {(node.name, "kept:eth0")}
        neutron = neutron_connection(kube_stack["neutron"])
        await eventually(lambda: port_gone(neutron, ports["went"]), "its port deleted")
        assert neutron.network.find_port(ports["kept"]) is not None
    finally:
        if not task.done():
            task.cancel()
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
