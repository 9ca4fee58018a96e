"""A NetworkPolicy the API accepts but whose Neutron form is too big (an ipBlock of the whole
IPv4 space with 40 host excepts, on two ports: 2044 rules), on the kube stack's real
apiserver and Neutron with a whole controller: refused with a PolicyNotEnforced Event naming
the size and the limit, its group kept empty (its pods isolated, allowed nothing by it), while
the other policies, and one made afterwards, are enforced; once it is made smaller, it is."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire.controller.app import NETPOL_NAME_PREFIX
from podwire.k8s.budget import MAX_POLICY_RULES, within_budget
from podwire.k8s.cidrs import allowed_prefixes
from podwire.k8s.groups import (
    OPEN_INGRESS,
    DesiredAddressGroup,
    DesiredGroup,
    DesiredPolicy,
    SgRule,
    group_name,
)
from podwire.k8s.objects import ObjectKey
from podwire.kubeside.refusals import policies_in
from podwire.neutron.client import neutron_connection
from podwire.neutron.netpol import NetpolObjects
from tests.controller.conftest import ScriptedNodes, make_network
from tests.k8s.objects import namespace_manifest, policy_manifest
from tests.k8s.test_apiserver import apply, pod
from tests.k8s.test_leader_kubernetes import (  # noqa: F401  (the fixtures)
    Start,
    deny_all_but_dns,
    groups_of,
    kube_etcd,
    project,
    scripted,
    settings,
    start,
)
from tests.k8s.test_refusal_events import events_of
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl


def hosts(count: int) -> list[str]:
    return [f"{10 + 3 * i}.{i}.0.1/32" for i in range(count)]


def wide(namespace: str, excepts: list[str], ports: tuple[int, ...]) -> dict[str, Any]:
    return policy_manifest(
        namespace,
        "wide",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
                {
                    "from": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": excepts}}],
                    "ports": [{"port": port, "protocol": "TCP"} for port in ports],
                }
            ],
        },
    )


def prefixes(excepts: list[str]) -> int:
    every = ipaddress.ip_network("0.0.0.0/0")
    return len(allowed_prefixes(every, [ipaddress.ip_network(e) for e in excepts]))


def test_a_policy_over_the_limit_is_emptied_and_its_address_groups_dropped() -> None:
    """The pure part: only the groups of the policy over the limit (its own and its named
    ports') lose their rules, and an address group only their rules named goes with them."""
    key, other = ObjectKey("ns", "big"), ObjectKey("ns", "small")
    big = frozenset(
        SgRule("ingress", "IPv4", "tcp", port, port, remote_address_group="ag-big")
        for port in range(1, 12)
    )
    small = frozenset({SgRule("ingress", "IPv4", "udp", 53, 53, remote_address_group="ag-s")})
    named = frozenset({SgRule("ingress", "IPv4", "tcp", 8080, 8080)})
    desired = DesiredPolicy(
        groups={
            group_name(key): DesiredGroup(group_name(key), "big", big, key),
            "np-named": DesiredGroup("np-named", "big where web/TCP=1", named, key),
            group_name(other): DesiredGroup(group_name(other), "small", small, other),
        },
        address_groups={
            name: DesiredAddressGroup(name, name, frozenset()) for name in ("ag-big", "ag-s")
        },
    )
    kept, over = within_budget(desired, [key, other], limit=11)
    assert [(o.policy, o.rules, o.limit) for o in over] == [(key, 12, 11)]  # with its named
    assert kept.groups[group_name(key)].rules == frozenset()
    assert kept.groups["np-named"].rules == frozenset()
    assert kept.groups[group_name(other)].rules == small
    assert set(kept.address_groups) == {"ag-s"}
    assert within_budget(desired, [key, other], limit=12) == (desired, [])


@pytest.mark.stack
@pytest.mark.slow
async def test_a_policy_too_big_for_neutron_is_named_while_the_others_are_enforced(
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
    make_network(neutron, project, "pw-budget", "10.88.0.0/24")
    config = settings(kube_stack, [node], project, kube_stack["kubeconfig"])
    await start(config)
    name = f"big-{uuid.uuid4().hex[:8]}"
    tag = config.deployment.tag
    too_many = hosts(40)
    assert prefixes(too_many) * 2 > MAX_POLICY_RULES
    wide_group = group_name(ObjectKey(name, "wide"))
    dns_group = group_name(ObjectKey(name, "dns"))

    def found() -> dict[str, set[Any]]:
        return groups_of(neutron, project, tag)

    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
            deny_all_but_dns(name),
            wide(name, too_many, (80, 443)),
        )
        events = await eventually(events_of(kube_stack, name, "PolicyNotEnforced"), "the Event")
        (event,) = events
        assert event["involvedObject"]["name"] == "wide"
        message = event["message"]
        assert f"{prefixes(too_many) * 2} Neutron security-group rules" in message, message
        assert f"limit of {MAX_POLICY_RULES}" in message, message

        def refused_and_others_enforced() -> bool:
            now = found()
            return now.get(wide_group) == set() and now.get(dns_group) == {
                ("ingress", "udp", 53, 53)
            }

        await eventually(
            lambda: asyncio.to_thread(refused_and_others_enforced),
            "the big policy's group empty, the other's enforced",
            timeout=30,
        )
        # The reconciler goes on: a policy made afterwards is enforced, the big one stays
        # refused, and is named once in the log.
        late = deny_all_but_dns(name)
        late["metadata"]["name"] = "late"
        late["spec"]["ingress"][0]["ports"][0]["port"] = 5353
        await apply(kube_stack, tmp_path, late)
        late_group = group_name(ObjectKey(name, "late"))

        def late_enforced() -> bool:
            now = found()
            return now.get(late_group) == {("ingress", "udp", 5353, 5353)}

        await eventually(lambda: asyncio.to_thread(late_enforced), "the later policy", 30)
        assert found()[wide_group] == set()
        lines = [r for r in caplog.records if r.getMessage() == "netpol.policy_not_enforced"]
        assert len(lines) == 1, lines

        # Made smaller, it is enforced: one rule per prefix around its three excepts.
        few = hosts(3)
        await apply(kube_stack, tmp_path, wide(name, few, (80,)))

        def enforced() -> bool:
            rules = found().get(wide_group)
            return rules == {("ingress", "tcp", 80, 80)}

        await eventually(lambda: asyncio.to_thread(enforced), "the smaller policy enforced", 60)
        objects_rules = _rule_count(neutron, project, tag, wide_group)
        assert objects_rules == prefixes(few), objects_rules
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


def _rule_count(neutron: Any, project_id: str, tag: str, name: str) -> int:
    objects = NetpolObjects(neutron, project_id, tag, NETPOL_NAME_PREFIX)
    return next(len(g.rules) for g in objects.groups() if g.name == name)


def test_a_refused_named_port_group_names_its_policy() -> None:
    """Neutron refusing a policy's named-port group (or an address group its rules name) is
    told on that policy, not on the others."""
    key, other = ObjectKey("ns", "web"), ObjectKey("ns", "db")
    to_ag = frozenset({SgRule("ingress", "IPv4", "udp", 53, 53, remote_address_group="ag")})
    desired = DesiredPolicy(
        groups={
            group_name(key): DesiredGroup(group_name(key), "web", frozenset(), key),
            "np-named": DesiredGroup("np-named", "web where web/TCP=1", frozenset(), key),
            group_name(other): DesiredGroup(group_name(other), "db", to_ag, other),
        },
        address_groups={},
    )
    assert policies_in(desired, [key, other], ["np-named"]) == [key]
    assert policies_in(desired, [key, other], ["ag"]) == [other]
    assert policies_in(desired, [key, other], [OPEN_INGRESS]) == []


def ported(namespace: str, ports: range) -> dict[str, Any]:
    """A policy admitting web's pods on ``ports``, one ingress rule per port."""
    return policy_manifest(
        namespace,
        "many",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"ports": [{"port": port, "protocol": "TCP"}]} for port in ports],
        },
    )


@pytest.mark.stack
@pytest.mark.slow
async def test_a_policy_podwire_cannot_read_is_kept_closed_and_named(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The API takes 257 ingress rules, podwire's reader stops at 256: the policy changed into
    that form stops allowing what it allowed (its pods isolated, allowed nothing by it, not
    left open or with its old rules), gets an Event naming the field, and is enforced again
    once changed back."""
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    make_network(neutron, project, "pw-unread", "10.88.1.0/24")
    config = settings(kube_stack, [node], project, kube_stack["kubeconfig"])
    await start(config)
    name = f"unread-{uuid.uuid4().hex[:8]}"
    many_group = group_name(ObjectKey(name, "many"))

    def rules_now() -> set[Any] | None:
        return groups_of(neutron, project, config.deployment.tag).get(many_group)

    async def until_rules(wanted: set[Any], what: str) -> None:
        await eventually(lambda: asyncio.to_thread(lambda: rules_now() == wanted), what, 60)

    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
            ported(name, range(80, 81)),
        )
        await until_rules({("ingress", "tcp", 80, 80)}, "the readable policy enforced")
        await apply(kube_stack, tmp_path, ported(name, range(1000, 1257)))
        await until_rules(set(), "the unreadable policy closed")
        events = await eventually(events_of(kube_stack, name, "PolicyNotEnforced"), "the Event")
        (event,) = events
        assert event["involvedObject"]["name"] == "many"
        assert "podwire cannot read this policy" in event["message"], event["message"]
        assert "spec.ingress" in event["message"] and "256" in event["message"], event
        await apply(kube_stack, tmp_path, ported(name, range(81, 82)))
        await until_rules({("ingress", "tcp", 81, 81)}, "the policy enforced once readable")
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
