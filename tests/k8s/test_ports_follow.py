"""In-use ports follow their pods' NetworkPolicies, on the kube stack's real apiserver and
Neutron, through a whole controller with ``[kubernetes]``: a policy made after a pod's port
was handed out adds its group to that port, a relabelled pod's port changes groups (one
port update each, only for the ports whose set changed), a pod relabelled into a selector
appears in its address group, and a deleted policy's group leaves every port, pooled ones
included, and then Neutron. A pooled port of another set taken for a pod gets its groups by
the one update a take makes for any other set."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from podwire.controller.app import Controller
from podwire.k8s.groups import OPEN_EGRESS, OPEN_INGRESS, group_name
from podwire.k8s.objects import ObjectKey
from podwire.neutron.client import neutron_connection
from podwire.schema.inuse import PoolKey
from tests.controller.conftest import ScriptedNodes, make_network, release_vif, request_vif
from tests.k8s.objects import namespace_manifest, policy_manifest
from tests.k8s.test_apiserver import apply, pod
from tests.k8s.test_leader_kubernetes import (  # noqa: F401  (the fixtures)
    Start,
    body,
    controller_url,
    group_ids,
    kube_etcd,
    metric,
    project,
    scripted,
    settings,
    start,
    uid_of,
)
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl

UPDATES = 'podwire_neutron_calls_total{op="update_port"}'


def web_in(namespace: str) -> dict[str, Any]:
    """Isolates app=web for ingress, allowing only app=client."""
    return policy_manifest(
        namespace,
        "web-in",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}],
        },
    )


def port_groups(neutron: Any, port_id: str) -> set[str]:
    return set(neutron.network.get_port(port_id).security_group_ids)


def relabel(kube_stack: dict[str, Any], namespace: str, name: str, app: str) -> None:
    done = kubectl(kube_stack, "label", "pod", "-n", namespace, name, f"app={app}", "--overwrite")
    assert done.returncode == 0, done.stderr


def give_address(kube_stack: dict[str, Any], namespace: str, name: str, ip: str) -> None:
    """What kubelet reports once the pod's sandbox is up (no kubelet runs these pods)."""
    status = {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}
    done = kubectl(
        kube_stack, "patch", "pod", "-n", namespace, name, "--subresource=status",
        "--type=merge", "-p", json.dumps(status),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


async def updates(http: aiohttp.ClientSession, controller: Controller) -> float:
    return await metric(http, controller, UPDATES) or 0.0


async def test_in_use_ports_and_address_groups_follow_policies_and_labels(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    network = make_network(neutron, project, "pw-follow", "10.81.0.0/24")
    base = settings(kube_stack, [node], project, kube_stack["kubeconfig"])
    controller = await start(replace(base, pool=replace(base.pool, recycle_on_release=True)))
    tag = controller.settings.deployment.tag
    url = controller_url(controller)
    name = f"np-{uuid.uuid4().hex[:8]}"
    policy = group_name(ObjectKey(name, "web-in"))

    def ref(pod_name: str, attachment: str) -> dict[str, Any]:
        request = body(network)
        request["attachment"] = attachment
        request["pod"] = {
            "namespace": name,
            "name": pod_name,
            "uid": uid_of(kube_stack, name, pod_name),
        }
        return request

    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
            pod(name, "db", {"app": "db"}),
            pod(name, "spare", {"app": "web"}),
            pod(name, "peer", {"app": "other"}),
        )
        give_address(kube_stack, name, "peer", "10.81.9.9")
        async with aiohttp.ClientSession() as http:
            answers = {}
            for pod_name in ("web", "db", "spare"):
                status, answers[pod_name] = await request_vif(
                    http, url, node, ref(pod_name, f"{pod_name}:eth0")
                )
                assert status == 200, answers[pod_name]
            web, db, spare = (answers[p]["vif"]["port_id"] for p in ("web", "db", "spare"))
            ids = await asyncio.to_thread(group_ids, neutron, project, tag)
            open_both = {ids[OPEN_INGRESS], ids[OPEN_EGRESS]}
            assert port_groups(neutron, web) == open_both

            # A policy made while the pods run: the ports it selects gain its group (and
            # lose the open ingress group); the others are not touched.
            before = await updates(http, controller)
            await apply(kube_stack, tmp_path, web_in(name))

            async def isolated(port: str) -> bool:
                found = await asyncio.to_thread(group_ids, neutron, project, tag)
                wanted = {found.get(policy), found[OPEN_EGRESS]}
                return await asyncio.to_thread(port_groups, neutron, port) == wanted

            await eventually(lambda: isolated(web), "web's port in the new policy", timeout=30)
            await eventually(lambda: isolated(spare), "spare's port too", timeout=30)
            assert port_groups(neutron, db) == open_both
            assert await updates(http, controller) - before == 2  # web's and spare's
            ids = await asyncio.to_thread(group_ids, neutron, project, tag)
            record = controller.service.attachments[(node.name, "web:eth0")]
            assert set(record.vif.security_groups) == {ids[policy], ids[OPEN_EGRESS]}
            assert record.pod is not None and record.pod.name == "web"

            # A relabelled pod's port changes groups: db into the policy, web out of it.
            before = await updates(http, controller)
            relabel(kube_stack, name, "db", "web")
            relabel(kube_stack, name, "web", "db")
            await eventually(lambda: isolated(db), "db's port in the policy", timeout=30)

            async def opened(port: str) -> bool:
                return await asyncio.to_thread(port_groups, neutron, port) == open_both

            await eventually(lambda: opened(web), "web's port out of it", timeout=30)
            assert await updates(http, controller) - before == 2

            # A pod relabelled into a selector appears in its address group (the project's
            # one: app=client's), and leaves it.
            async def members() -> set[str]:
                found = await asyncio.to_thread(
                    lambda: list(neutron.network.address_groups(project_id=project))
                )
                assert len(found) == 1, found
                return set(found[0].addresses)

            assert await members() == set()
            relabel(kube_stack, name, "peer", "client")

            async def joined() -> bool:
                return await members() == {"10.81.9.9/32"}

            await eventually(joined, "peer's address in the address group", timeout=30)
            relabel(kube_stack, name, "peer", "other")

            async def left() -> bool:
                return await members() == set()

            await eventually(left, "peer's address out of it", timeout=30)

            # spare's pod goes (its port back to the pool, still carrying the group), then
            # the policy: db's port leaves the group, the pooled port is cleared of it, and
            # the group goes from Neutron once no port carries it.
            assert await release_vif(http, url, node, "spare:eth0") == 204
            key = PoolKey(node.name, project, network.id)

            async def pooled() -> bool:
                groups = controller.service.pools.groups(key)
                return any(spare in ports and ids[policy] in sgs for sgs, ports in groups)

            await eventually(pooled, "spare's port pooled with the policy's group", timeout=30)
            kubectl(kube_stack, "delete", "networkpolicy", "-n", name, "web-in")
            await eventually(lambda: opened(db), "db's port out of the deleted policy", timeout=30)

            async def gone() -> bool:
                return policy not in await asyncio.to_thread(group_ids, neutron, project, tag)

            await eventually(gone, "the deleted policy's group gone from Neutron", timeout=30)
            assert ids[policy] not in port_groups(neutron, spare)
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


async def test_a_pooled_port_of_another_set_gets_a_pods_groups_by_one_update(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    network = make_network(neutron, project, "pw-reuse", "10.82.0.0/24")
    controller = await start(settings(kube_stack, [node], project, kube_stack["kubeconfig"]))
    tag = controller.settings.deployment.tag
    url = controller_url(controller)
    name = f"np-{uuid.uuid4().hex[:8]}"
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
            web_in(name),
        )
        async with aiohttp.ClientSession() as http:
            # A request of no pod fills the pool with ports of no group.
            status, answer = await request_vif(http, url, node, body(network))
            assert status == 200, answer
            key = PoolKey(node.name, project, network.id)

            async def filled() -> bool:
                return any(ports for sgs, ports in controller.service.pools.groups(key))

            await eventually(filled, "the pool refilled", timeout=30)
            assert [sgs for sgs, ports in controller.service.pools.groups(key) if ports] == [()]
            before = await updates(http, controller)
            hits = await metric(http, controller, "podwire_pool_hits_total")
            reuses = await metric(http, controller, "podwire_pool_sg_reuses_total") or 0.0
            request = body(network)
            request["attachment"] = "web:eth0"
            request["pod"] = {
                "namespace": name,
                "name": "web",
                "uid": uid_of(kube_stack, name, "web"),
            }
            status, answer = await request_vif(http, url, node, request)
            assert status == 200, answer
            ids = await asyncio.to_thread(group_ids, neutron, project, tag)
            wanted = sorted([ids[group_name(ObjectKey(name, "web-in"))], ids[OPEN_EGRESS]])
            assert answer["vif"]["security_groups"] == wanted
            assert sorted(port_groups(neutron, answer["vif"]["port_id"])) == wanted
            assert await updates(http, controller) - before == 1
            assert await metric(http, controller, "podwire_pool_sg_reuses_total") == reuses + 1
            assert await metric(http, controller, "podwire_pool_hits_total") == hits
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
