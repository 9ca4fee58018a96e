"""The isolation semantics as properties over random clusters: a pod is default-deny in a
direction exactly when a policy of that type selects it, and then carries every such policy's
group; an address group holds exactly the addresses of the pods its selector names."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podwire.k8s.compile import compile_policies
from podwire.k8s.groups import OPEN_EGRESS, OPEN_INGRESS, group_name
from tests.k8s.objects import cluster, key, namespace, pod, policy

NAMES = ("a", "b")
labels = st.dictionaries(st.sampled_from(("app", "tier")), st.sampled_from(("x", "y")), max_size=2)
types = st.sampled_from([None, ["Ingress"], ["Egress"], ["Ingress", "Egress"]])


@st.composite
def clusters(draw: Any) -> Any:
    namespaces = [namespace(name, **draw(labels)) for name in NAMES]
    pods = [
        pod(draw(st.sampled_from(NAMES)), f"p{i}", [f"10.0.0.{i + 1}"], draw(labels))
        for i in range(draw(st.integers(0, 5)))
    ]
    policies = []
    for i in range(draw(st.integers(0, 4))):
        spec: dict[str, Any] = {"podSelector": {"matchLabels": draw(labels)}}
        if (chosen := draw(types)) is not None:
            spec["policyTypes"] = chosen
        if draw(st.booleans()):
            spec["egress"] = [{"to": [{"namespaceSelector": {"matchLabels": draw(labels)}}]}]
        if draw(st.booleans()):
            spec["ingress"] = [{"from": [{"podSelector": {"matchLabels": draw(labels)}}]}]
        policies.append(policy(draw(st.sampled_from(NAMES)), f"n{i}", spec))
    return namespaces, pods, policies


def selected(policy_: Any, pod_: Any) -> bool:
    same_namespace = policy_.meta.key.namespace == pod_.meta.key.namespace
    wanted = dict(r_key_value(r) for r in policy_.pod_selector.requirements)
    return same_namespace and wanted.items() <= pod_.meta.labels.items()


def r_key_value(requirement: Any) -> tuple[str, str]:
    return requirement.key, requirement.values[0]


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_isolation_follows_the_specification(drawn: Any) -> None:
    namespaces, pods, policies = drawn
    desired = compile_policies(cluster(namespaces, pods, policies))
    for pod_ in pods:
        chosen = [p for p in policies if selected(p, pod_)]
        ingress = {p.meta.key for p in chosen if "Ingress" in p.types}
        egress = {p.meta.key for p in chosen if "Egress" in p.types}
        groups = desired.pods[pod_.meta.key].groups
        assert (OPEN_INGRESS in groups) == (not ingress)
        assert (OPEN_EGRESS in groups) == (not egress)
        assert {group_name(k) for k in ingress | egress} <= groups
        assert groups <= {group_name(p.meta.key) for p in chosen} | {OPEN_INGRESS, OPEN_EGRESS}
    for policy_ in policies:
        labels_of = {n.meta.key.name: n.meta.labels for n in namespaces}
        for direction, rules in (("ingress", policy_.ingress), ("egress", policy_.egress)):
            if direction.capitalize() not in policy_.types or not rules:
                continue
            (peer,) = rules[0].peers
            if direction == "ingress":  # a pod selector in the policy's namespace
                members = [
                    p
                    for p in pods
                    if p.meta.key.namespace == policy_.meta.key.namespace
                    and _matches(peer.pods, p.meta.labels)
                ]
            else:  # a namespace selector: every pod of the namespaces it selects
                members = [
                    p for p in pods if _matches(peer.namespaces, labels_of[p.meta.key.namespace])
                ]
            names = {
                r.remote_address_group
                for r in desired.groups[group_name(policy_.meta.key)].rules
                if r.direction == direction
            }
            (name,) = names
            assert desired.address_groups[name].addresses == {f"{p.ips[0]}/32" for p in members}


def _matches(selector: Any, labels_: dict[str, str]) -> bool:
    return dict(r_key_value(r) for r in selector.requirements).items() <= labels_.items()


@given(clusters())
def test_an_unselected_pod_is_open_both_ways(drawn: Any) -> None:
    namespaces, pods, _ = drawn
    desired = compile_policies(cluster(namespaces, pods, []))
    assert all(
        desired.pods[key(p.meta.key.namespace, p.meta.key.name)].groups
        == {OPEN_INGRESS, OPEN_EGRESS}
        for p in pods
    )
