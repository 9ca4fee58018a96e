"""Failures named as Kubernetes Events on the object they stop, by a whole controller with
``[kubernetes]`` on the kube stack's real apiserver, etcd and Neutron (scripted nodes): a
pod whose network has no subnet, a NetworkPolicy whose group exceeds the project's quota,
which is enforced once the quota is raised, and one whose address group Neutron refuses."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.neutron_counter import NeutronCounter, over_quota
from podwire.config import NeutronSettings
from podwire.k8s.groups import group_name
from podwire.k8s.objects import ObjectKey
from podwire.neutron.client import neutron_connection
from tests.controller.conftest import ScriptedNodes, make_network, request_vif
from tests.k8s.objects import namespace_manifest, policy_manifest
from tests.k8s.test_apiserver import apply, pod
from tests.k8s.test_gone_pods import pod_request
from tests.k8s.test_leader_kubernetes import (  # noqa: F401  (the fixtures)
    Start,
    controller_url,
    deny_all_but_dns,
    groups_of,
    kube_etcd,
    project,
    scripted,
    settings,
    start,
    uid_of,
)
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl


def warnings(kube_stack: dict[str, Any], namespace: str, reason: str) -> list[dict[str, Any]]:
    done = kubectl(kube_stack, "get", "events", "-n", namespace, "-o", "json")
    assert done.returncode == 0, done.stderr
    return [e for e in json.loads(done.stdout)["items"] if e["reason"] == reason]


def events_of(kube_stack: dict[str, Any], namespace: str, reason: str) -> Any:
    async def probe() -> list[dict[str, Any]]:
        return await asyncio.to_thread(warnings, kube_stack, namespace, reason)

    return probe


async def test_a_pod_whose_network_has_no_subnet_gets_one_event_naming_it(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    bare = neutron.network.create_network(project_id=project, name="pw-bare")
    controller = await start(settings(kube_stack, [node], project, kube_stack["kubeconfig"]))
    name = f"ev-{uuid.uuid4().hex[:8]}"
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
        )
        async with aiohttp.ClientSession() as http:
            for _ in range(3):  # kubelet asks again and again: one Event, not one each
                request = pod_request(kube_stack, network=bare, namespace=name, name="web")
                status, answer = await request_vif(http, controller_url(controller), node, request)
                assert status >= 400, answer
        found = await eventually(events_of(kube_stack, name, "FailedNeutronPort"), "the Event")
        await asyncio.sleep(1)  # what a second Event would need to arrive
        found = warnings(kube_stack, name, "FailedNeutronPort")
        assert len(found) == 1, found
        event = found[0]
        assert event["type"] == "Warning"
        assert event["involvedObject"]["name"] == "web"
        assert event["involvedObject"]["uid"] == uid_of(kube_stack, name, "web")
        assert "has no subnet" in event["message"], event["message"]
        assert bare.id in event["message"] or "pw-bare" in event["message"]
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


async def test_a_pod_whose_port_is_over_the_quota_gets_an_event_naming_it(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    """No port left in the project's quota: the pod's request is refused and the pod's
    Event carries Neutron's words; once the quota is raised the same request gets a port."""
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    net = make_network(neutron, project, "pw-portq", "10.87.2.0/24")
    neutron.network.update_quota(project, ports=0)
    controller = await start(settings(kube_stack, [node], project, kube_stack["kubeconfig"]))
    name = f"pq-{uuid.uuid4().hex[:8]}"
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
        )
        request = pod_request(kube_stack, network=net, namespace=name, name="web")
        async with aiohttp.ClientSession() as http:
            status, answer = await request_vif(http, controller_url(controller), node, request)
            assert status >= 400, answer
            found = await eventually(events_of(kube_stack, name, "FailedNeutronPort"), "Event")
            assert found[0]["involvedObject"]["name"] == "web"
            assert "Quota exceeded for resources: ['port']" in found[0]["message"], found
            neutron.network.update_quota(project, ports=50)

            async def served() -> bool:
                status, _ = await request_vif(http, controller_url(controller), node, request)
                return status < 400

            await eventually(served, "a port once the quota is raised", 60)
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
        neutron.network.delete_quota(project)


def many_ports(namespace: str) -> dict[str, Any]:
    """Ingress on eight TCP ports: sixteen rules (IPv4 and IPv6)."""
    ports = [{"port": 8000 + n, "protocol": "TCP"} for n in range(8)]
    return policy_manifest(namespace, "many", {"podSelector": {}, "ingress": [{"ports": ports}]})


async def test_a_policy_over_the_group_quota_is_named_and_enforced_once_it_is_raised(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    make_network(neutron, project, "pw-quota", "10.87.0.0/24")
    config = settings(kube_stack, [node], project, kube_stack["kubeconfig"])
    controller = await start(config)
    name = f"quota-{uuid.uuid4().hex[:8]}"
    tag = config.deployment.tag
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            deny_all_but_dns(name),
        )
        dns = group_name(ObjectKey(name, "dns"))

        def dns_on(port: int) -> bool:
            return groups_of(neutron, project, tag).get(dns) == {("ingress", "udp", port, port)}

        # The open groups and the other policy's exist before the quota is lowered.
        await eventually(lambda: asyncio.to_thread(dns_on, 53), "the other policy")
        # Groups count against their project (rules against the request's, which the
        # noauth stack leaves unset): no room for one more group.
        used = len(list(neutron.network.security_groups(project_id=project)))
        neutron.network.update_quota(project, security_groups=used)
        await apply(kube_stack, tmp_path, many_ports(name))

        found = await eventually(events_of(kube_stack, name, "PolicyNotEnforced"), "the Event")
        event = found[0]
        assert event["involvedObject"]["kind"] == "NetworkPolicy"
        assert event["involvedObject"]["name"] == "many"
        assert "Quota exceeded" in event["message"], event["message"]
        assert controller.kubernetes is not None
        assert controller.kubernetes.problem() is not None  # readiness names it too
        # The refused policy keeps no other from being enforced: a change to one is made.
        changed = deny_all_but_dns(name)
        changed["spec"]["ingress"][0]["ports"][0]["port"] = 5353
        await apply(kube_stack, tmp_path, changed)
        await eventually(lambda: asyncio.to_thread(dns_on, 5353), "the other policy changed", 60)
        assert wanted_missing(neutron, project, tag, name)

        neutron.network.update_quota(project, security_groups=used + 10)
        wanted = group_name(ObjectKey(name, "many"))

        def enforced() -> bool:
            rules = groups_of(neutron, project, tag).get(wanted)
            return rules is not None and len(rules) == 8  # 8 ports, (direction, proto, ports)

        await eventually(lambda: asyncio.to_thread(enforced), "the policy enforced", 60)
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
        neutron.network.delete_quota(project)


def wanted_missing(neutron: Any, project_id: str, tag: str, namespace: str) -> bool:
    return group_name(ObjectKey(namespace, "many")) not in groups_of(neutron, project_id, tag)


def from_clients(namespace: str) -> dict[str, Any]:
    """web's pods admit the ``role=client`` pods on TCP 80: an address group of theirs."""
    return policy_manifest(
        namespace,
        "peers",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                    "ports": [{"port": 80, "protocol": "TCP"}],
                }
            ],
        },
    )


async def test_a_policy_whose_address_group_neutron_refuses_is_named_and_kept_closed(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Neutron 29 has no quota on address groups, so its refusal is Neutron's OverQuota
    answer given by a relay in front of the real Neutron: the policy is named in an Event,
    its group allows nothing meanwhile (never its rule without the peers it names, which
    would be open to all), the other policy is still enforced, and once Neutron takes
    address groups again the policy is enforced with no one's help."""
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    make_network(neutron, project, "pw-agquota", "10.87.1.0/24")
    relay = NeutronCounter(kube_stack["neutron"])
    refusing = True

    def refuse(method: str, path: str) -> web.Response | None:
        wanted = refusing and method == "POST" and path.endswith("/address-groups")
        return over_quota("address_group") if wanted else None

    relay.refusing = refuse
    await relay.start()
    config = settings(kube_stack, [node], project, kube_stack["kubeconfig"])
    await start(replace(config, neutron=NeutronSettings(endpoint=relay.endpoint)))
    name = f"agq-{uuid.uuid4().hex[:8]}"
    tag = config.deployment.tag
    peers, dns = group_name(ObjectKey(name, "peers")), group_name(ObjectKey(name, "dns"))

    def rules_of(group: str) -> set[Any] | None:
        return groups_of(neutron, project, tag).get(group)

    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
            deny_all_but_dns(name),
            from_clients(name),
        )
        found = await eventually(events_of(kube_stack, name, "PolicyNotEnforced"), "the Event")
        assert {e["involvedObject"]["name"] for e in found} == {"peers"}, found
        assert "Quota exceeded for resources: ['address_group']" in found[0]["message"]
        closed = await asyncio.to_thread(rules_of, peers)
        assert not closed, closed  # made and empty, or not made: its pods are isolated
        changed = deny_all_but_dns(name)
        changed["spec"]["ingress"][0]["ports"][0]["port"] = 5353
        await apply(kube_stack, tmp_path, changed)
        wanted_dns = {("ingress", "udp", 5353, 5353)}
        await eventually(
            lambda: asyncio.to_thread(lambda: rules_of(dns) == wanted_dns), "the other policy", 60
        )
        assert not await asyncio.to_thread(rules_of, peers)

        refusing = False
        await eventually(
            lambda: asyncio.to_thread(lambda: rules_of(peers) == {("ingress", "tcp", 80, 80)}),
            "the policy enforced once Neutron takes its address group",
            60,
        )
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
        await relay.stop()
