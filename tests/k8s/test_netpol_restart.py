"""A controller restarted after the cluster changed without it, on the kube stack's real
apiserver and Neutron: nothing is kept of its last term but Neutron's objects and the in-use
records, and the watch events of the changes were never seen, so only the new term's first
lists and passes can catch up. A policy deleted meanwhile (its group still carried by the
port of a pod deleted meanwhile too), one made meanwhile, pods relabelled into and out of
selectors: once it leads again Neutron holds exactly what the policies now compile to, the
gone pod's port is released, and nothing marked by podwire is left over."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import pytest

from podwire.controller.app import NETPOL_NAME_PREFIX
from podwire.etcd.client import EtcdClient
from podwire.k8s.groups import OPEN_EGRESS, OPEN_INGRESS, group_name
from podwire.k8s.objects import ObjectKey
from podwire.neutron.client import neutron_connection
from podwire.neutron.netpol import NetpolObjects
from tests.controller.conftest import ScriptedNodes, make_network, request_vif
from tests.k8s.objects import namespace_manifest, policy_manifest
from tests.k8s.test_apiserver import apply, pod
from tests.k8s.test_gone_pods import delete_pod, graced, pod_request, port_gone, records
from tests.k8s.test_leader_kubernetes import (  # noqa: F401  (the fixtures)
    Start,
    controller_url,
    group_ids,
    kube_etcd,
    lead,
    project,
    scripted,
    settings,
    start,
)
from tests.k8s.test_ports_follow import give_address, port_groups, relabel
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl

pytestmark = [pytest.mark.stack, pytest.mark.slow]


class Rule(NamedTuple):
    """A marked group's rule as Neutron holds it, its address group by its addresses (the
    names are digests: what they hold is what the policy means)."""

    direction: str
    ethertype: str
    protocol: str | None
    port_min: int | None
    port_max: int | None
    remote_ip_prefix: str | None
    addresses: frozenset[str] | None


def everywhere(
    direction: str, protocol: str | None, port: int | None, addresses: set[str] | None
) -> frozenset[Rule]:
    """A rule for both families, as the compiler writes each one."""
    members = None if addresses is None else frozenset(addresses)
    return frozenset(
        Rule(direction, family, protocol, port, port, None, members) for family in ("IPv4", "IPv6")
    )


OPEN = {
    OPEN_INGRESS: everywhere("ingress", None, None, None),
    OPEN_EGRESS: everywhere("egress", None, None, None),
}


def ingress_from(namespace: str, name: str, selects: str, peer: str, port: int | None) -> Any:
    rule: dict[str, Any] = {"from": [{"podSelector": {"matchLabels": {"app": peer}}}]}
    if port is not None:
        rule["ports"] = [{"port": port, "protocol": "TCP"}]
    return policy_manifest(
        namespace, name, {"podSelector": {"matchLabels": {"app": selects}}, "ingress": [rule]}
    )


def neutron_now(neutron: Any, project_id: str, tag: str) -> dict[str, Any]:
    """The project's groups and address groups, read from Neutron: the marked groups with
    their rules, and whatever else is there that would be a leftover (a group neither marked
    nor Neutron's default, an address group no marked rule names)."""
    objects = NetpolObjects(neutron, project_id, tag, NETPOL_NAME_PREFIX)
    held = {group.id: group.addresses for group in objects.address_groups()}
    groups, named = {}, set()
    for group in objects.groups():
        rules = set()
        for rule in group.rules:
            remote = rule.remote_address_group_id
            named.add(remote)
            rules.add(
                Rule(
                    rule.direction,
                    rule.ethertype,
                    rule.protocol,
                    rule.port_min,
                    rule.port_max,
                    rule.remote_ip_prefix,
                    None if remote is None else held.get(remote, frozenset({"unmarked"})),
                )
            )
        groups[group.name] = frozenset(rules)
    every_group = {str(g.name) for g in neutron.network.security_groups(project_id=project_id)}
    every_address_group = {
        str(g.id): str(g.name) for g in neutron.network.address_groups(project_id=project_id)
    }
    return {
        "groups": groups,
        "other groups": sorted(every_group - set(groups) - {"default"}),
        "unnamed address groups": sorted(
            name for known, name in every_address_group.items() if known not in named
        ),
    }


async def test_a_restarted_controller_converges_on_what_changed_while_it_was_stopped(
    kube_stack: dict[str, Any],
    kube_etcd: EtcdClient,  # noqa: F811
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    network = make_network(neutron, project, "pw-restart", "10.91.0.0/24")
    config = graced(settings(kube_stack, [node], project, kube_stack["kubeconfig"]), 0.0)
    tag = config.deployment.tag
    name = f"restart-{uuid.uuid4().hex[:8]}"
    web_in, old, new = (group_name(ObjectKey(name, p)) for p in ("web-in", "old", "new"))
    address = {p: f"10.91.9.{i}/32" for i, p in enumerate(("client", "joiner", "leaver"), 1)}
    address |= {"api": "10.91.9.4/32", "old-peer": "10.91.9.5/32"}

    def now() -> dict[str, Any]:
        return neutron_now(neutron, project, tag)

    async def until(wanted: dict[str, Any], what: str) -> None:
        """Failing, shows what Neutron holds beside what it should."""
        found: dict[str, Any] = {}

        async def probe() -> bool:
            found["now"] = await asyncio.to_thread(now)
            return bool(found["now"] == wanted)

        with contextlib.suppress(AssertionError):
            await eventually(probe, what, 60)
        assert found["now"] == wanted, what

    first, task = await lead(config, kube_etcd)
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
            pod(name, "went", {"app": "db"}),
            pod(name, "client", {"app": "client"}),
            pod(name, "joiner", {"app": "other"}),
            pod(name, "leaver", {"app": "client"}),
            pod(name, "old-peer", {"app": "old-peer"}),
            ingress_from(name, "web-in", "web", "client", None),
            ingress_from(name, "old", "db", "old-peer", 5432),
        )
        for peer in ("client", "joiner", "leaver", "old-peer"):
            give_address(kube_stack, name, peer, address[peer].removesuffix("/32"))
        clients = {address["client"], address["leaver"]}
        await until(
            {
                "groups": OPEN
                | {
                    web_in: everywhere("ingress", None, None, clients),
                    old: everywhere("ingress", "tcp", 5432, {address["old-peer"]}),
                },
                "other groups": [],
                "unnamed address groups": [],
            },
            "the policies enforced by the first controller",
        )
        ids = group_ids(neutron, project, tag)
        ports = {}
        async with aiohttp.ClientSession() as http:
            for pod_name in ("web", "went", "leaver"):
                request = pod_request(kube_stack, network, name, pod_name)
                status, answer = await request_vif(http, controller_url(first), node, request)
                assert status == 200, answer
                ports[pod_name] = answer["vif"]["port_id"]
        assert port_groups(neutron, ports["went"]) == {ids[old], ids[OPEN_EGRESS]}

        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # While no controller runs: one policy goes, another comes (with a pod it admits),
        # a pod joins a selector and another leaves it for a policy's, and the pod whose
        # port carries the deleted policy's group goes.
        done = kubectl(kube_stack, "delete", "networkpolicy", "-n", name, "old")
        assert done.returncode == 0, done.stderr
        await apply(
            kube_stack,
            tmp_path,
            pod(name, "api", {"app": "api"}),
            ingress_from(name, "new", "web", "api", 8443),
        )
        give_address(kube_stack, name, "api", address["api"].removesuffix("/32"))
        relabel(kube_stack, name, "joiner", "client")
        relabel(kube_stack, name, "leaver", "web")
        delete_pod(kube_stack, name, "went")
        assert now()["groups"].keys() == OPEN.keys() | {web_in, old}  # nobody caught up

        await start(config)
        await until(
            {
                "groups": OPEN
                | {
                    web_in: everywhere(
                        "ingress", None, None, {address["client"], address["joiner"]}
                    ),
                    new: everywhere("ingress", "tcp", 8443, {address["api"]}),
                },
                "other groups": [],
                "unnamed address groups": [],
            },
            "Neutron holding what the policies now compile to, and nothing else",
        )
        await eventually(lambda: port_gone(neutron, ports["went"]), "the gone pod's port deleted")
        assert await records(kube_etcd, node.name) == {"web:eth0", "leaver:eth0"}
        after = group_ids(neutron, project, tag)
        # The policy that stayed keeps its group: its pods' ports are not moved for nothing.
        assert after[web_in] == ids[web_in]
        selected = {after[web_in], after[new], after[OPEN_EGRESS]}

        async def followed() -> bool:
            carried = [
                await asyncio.to_thread(port_groups, neutron, ports[p]) for p in ("web", "leaver")
            ]
            return carried == [selected, selected]

        await eventually(followed, "the remaining pods' ports in their policies' groups", 30)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
