"""The pod shows its port, and a Node deleted from the API releases its ports: a whole
controller with ``[kubernetes]`` on the kube stack's real apiserver, etcd and Neutron, its
nodes scripted (no kubelet: a pod's address is set through the status subresource as
kubelet would)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from podwire.k8s.port_annotations import (
    ADDRESSES,
    MAC,
    NETWORK,
    NETWORK_STATUS,
    PORT_ID,
)
from podwire.neutron.client import neutron_connection
from podwire.schema.vif import DEVICE_OWNER
from tests.controller.conftest import ScriptedNodes, make_network, request_vif
from tests.k8s.objects import namespace_manifest
from tests.k8s.test_apiserver import apply, pod
from tests.k8s.test_gone_pods import pod_request, port_gone, records
from tests.k8s.test_leader_kubernetes import (  # noqa: F401  (the fixtures)
    Start,
    body,
    controller_url,
    kube_etcd,
    project,
    scripted,
    settings,
    start,
    uid_of,
)
from tests.k8s.test_ports_follow import give_address
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl


def annotations(kube_stack: dict[str, Any], namespace: str, name: str) -> dict[str, str]:
    done = kubectl(kube_stack, "get", "pod", "-n", namespace, name, "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["metadata"].get("annotations") or {}


def annotated(kube_stack: dict[str, Any], namespace: str, name: str, count: int) -> Any:
    async def probe() -> dict[str, str] | None:
        found = await asyncio.to_thread(annotations, kube_stack, namespace, name)
        return found if len(found) >= count else None

    return probe


def logged(caplog: Any, event: str) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if r.getMessage() == event]


def patches(caplog: Any, namespace: str, name: str) -> int:
    found = logged(caplog, "controller.pod_annotated")
    return sum(1 for fields in found if fields["pod"] == f"{namespace}/{name}")


async def test_a_pod_shows_its_port_and_keeps_its_other_annotations(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
    caplog: Any,
) -> None:
    caplog.set_level(logging.INFO)
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    network = make_network(neutron, project, "pw-shown", "10.85.0.0/24")
    controller = await start(settings(kube_stack, [node], project, kube_stack["kubeconfig"]))
    name = f"shown-{uuid.uuid4().hex[:8]}"
    web = pod(name, "web", {"app": "web"})
    web["metadata"]["annotations"] = {"example.org/keep": "yes"}
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            web,
            pod(name, "own", {"app": "own"}),
        )
        async with aiohttp.ClientSession() as http:
            request = pod_request(kube_stack, network, name, "web")
            status, answer = await request_vif(http, controller_url(controller), node, request)
            assert status == 200, answer
        vif = answer["vif"]
        found = await eventually(annotated(kube_stack, name, "web", 6), "web's annotations")
        assert found["example.org/keep"] == "yes"
        assert found[PORT_ID] == vif["port_id"]
        assert found[MAC] == vif["mac_address"]
        assert json.loads(found[ADDRESSES]) == [ip["ip_address"] for ip in vif["fixed_ips"]]
        assert found[NETWORK] == network.id
        assert json.loads(found[NETWORK_STATUS]) == [
            {
                "name": "podwire",
                "interface": "eth0",
                "ips": json.loads(found[ADDRESSES]),
                "mac": vif["mac_address"],
                "default": True,
                "dns": {},
            }
        ]

        # A port an agent made straight in Neutron (vif_source = "neutron"): found by the
        # pod's uid as its device_id once the pod has an address.
        own_uid = uid_of(kube_stack, name, "own")
        port = neutron.network.create_port(
            network_id=network.id,
            project_id=project,
            device_owner=DEVICE_OWNER,
            device_id=own_uid,
        )
        address = port.fixed_ips[0]["ip_address"]
        give_address(kube_stack, name, "own", address)
        own = await eventually(annotated(kube_stack, name, "own", 5), "own's annotations")
        assert own[PORT_ID] == port.id
        assert json.loads(own[ADDRESSES]) == [address]

        # Other events about the pod patch nothing again: its values did not change.
        kubectl(kube_stack, "label", "pod", "-n", name, "web", "tier=front")
        kubectl(kube_stack, "label", "pod", "-n", name, "own", "tier=back")
        await asyncio.sleep(2)
        assert patches(caplog, name, "web") == 1
        assert patches(caplog, name, "own") == 1
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


def node_object(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


async def test_a_node_deleted_from_the_api_releases_its_ports(
    kube_stack: dict[str, Any],
    kube_etcd: Any,  # noqa: F811
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
    caplog: Any,
) -> None:
    caplog.set_level(logging.INFO)
    gone, stays, idle = await scripted.add(), await scripted.add(), await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    network = make_network(neutron, project, "pw-nodes", "10.86.0.0/24")
    config = settings(kube_stack, [gone, stays, idle], project, kube_stack["kubeconfig"])
    controller = await start(config)
    try:
        await apply(kube_stack, tmp_path, *(node_object(n.name) for n in (gone, stays, idle)))
        ports = {}
        async with aiohttp.ClientSession() as http:
            for node in (gone, stays):
                status, answer = await request_vif(
                    http, controller_url(controller), node, body(network)
                )
                assert status == 200, answer
                ports[node.name] = answer["vif"]["port_id"]

        async def listed() -> bool:  # the Node informer holds them: their deletion is news
            return any(f["kind"] == "nodes" for f in logged(caplog, "k8s.listed"))

        await eventually(listed, "the Nodes listed")
        kubectl(kube_stack, "delete", "node", gone.name, idle.name)

        async def released() -> list[dict[str, Any]]:  # logged once its removal is done
            return logged(caplog, "controller.node_released")

        lines = await eventually(released, "the deleted Node released", timeout=30)
        # The Node podwire held nothing for is no news: only the other is released.
        assert [(f["node"], f["reason"]) for f in lines] == [(gone.name, "deleted")]
        assert not await records(kube_etcd, gone.name)
        assert await port_gone(neutron, ports[gone.name])
        assert await records(kube_etcd, stays.name) == {"k1:eth0"}
        assert neutron.network.find_port(ports[stays.name]) is not None
        assert not [key for key in controller.service.pool_keys() if key.node == gone.name]
    finally:
        names = [node.name for node in (gone, stays, idle)]
        kubectl(kube_stack, "delete", "node", *names, "--ignore-not-found")
