"""Strict readers: what the API may hold but podwire cannot use is refused, naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podwire.errors import ValidationError
from podwire.k8s.netpol import EGRESS, INGRESS, read_network_policy, read_policy_or_closed
from podwire.k8s.objects import read_namespace, read_pod
from podwire.k8s.selectors import EVERYTHING, read_selector
from tests.k8s.objects import meta, policy


def _policy(spec: Any) -> Any:
    return {"metadata": meta("p", "a"), "spec": spec}


REFUSED = [
    ({"podSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}}, "operator"),
    ({"podSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}, "at least one"),
    (
        {
            "podSelector": {
                "matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]
            }
        },
        "takes no values",
    ),
    ({"podSelector": {}, "policyTypes": ["Sideways"]}, "policyTypes"),
    ({"podSelector": {}, "ingress": [{"from": [{}]}]}, "names no podSelector"),
    (
        {
            "podSelector": {},
            "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}],
        },
        "takes no selectors",
    ),
    (
        {
            "podSelector": {},
            "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/8"]}}]}],
        },
        "not inside",
    ),
    ({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "ten"}}]}]}, "not a CIDR"),
    ({"podSelector": {}, "ingress": [{"ports": [{"port": "http", "endPort": 90}]}]}, "numeric"),
    ({"podSelector": {}, "ingress": [{"ports": [{"port": 100, "endPort": 90}]}]}, "endPort"),
    ({"podSelector": {}, "ingress": [{"ports": [{"port": 70000}]}]}, "port"),
    ({"podSelector": {}, "ingress": [{"ports": [{"protocol": "ICMP"}]}]}, "protocol"),
    ({"podSelector": {}, "ingress": "all"}, "expected a list"),
    ("spec", "expected a JSON object"),
    ({"podSelector": {}, "ingress": [{"ports": [{"port": 1}]}] * 257}, "more than 256"),
]


@pytest.mark.parametrize(("spec", "field"), REFUSED)
def test_policy_the_compiler_cannot_use_is_refused(spec: Any, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        read_network_policy(_policy(spec))


@pytest.mark.parametrize(("spec", "field"), REFUSED)
def test_the_informer_keeps_a_refused_policy_closed_naming_why(spec: Any, field: str) -> None:
    """Never skipped (its pods would be open): no rules, the refusal named."""
    closed = read_policy_or_closed(_policy(spec))
    assert closed.ingress == () and closed.egress == ()
    assert closed.refused is not None and field in closed.refused
    assert field in (closed.not_enforced() or "")


def test_a_closed_policy_keeps_what_can_be_read_and_assumes_the_most_otherwise() -> None:
    readable = {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"]}
    closed = read_policy_or_closed(_policy({**readable, "egress": [{"to": [{}]}]}))
    assert closed.pod_selector == read_selector({"matchLabels": {"app": "web"}}, "s")
    assert closed.types == {EGRESS}
    # Its selector or its directions unreadable: every pod of the namespace, both ways.
    bad = {"podSelector": {"matchExpressions": [{"key": "k"}]}, "policyTypes": ["Up"]}
    closed = read_policy_or_closed(_policy(bad))
    assert (closed.pod_selector, closed.types) == (EVERYTHING, {INGRESS, EGRESS})
    assert read_policy_or_closed(_policy({"podSelector": {}})).refused is None


def test_a_policy_without_usable_metadata_is_still_refused() -> None:
    with pytest.raises(ValidationError, match="metadata"):
        read_policy_or_closed({"metadata": {"name": "p"}, "spec": {"ingress": "all"}})


def test_ip_block_with_host_bits_means_its_network() -> None:
    spec = {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.1.2.3/16"}}]}]}
    (rule,) = policy("a", "p", spec).ingress
    assert rule.peers is not None and rule.peers[0].ip_block is not None
    assert str(rule.peers[0].ip_block.cidr) == "10.1.0.0/16"


@pytest.mark.parametrize(
    "body",
    [
        {"metadata": {"name": "Bad_Name", "uid": "u", "resourceVersion": "1"}},
        {"metadata": {"name": "a", "resourceVersion": "1"}},
        {"metadata": {"name": "a", "uid": "u", "resourceVersion": "1", "labels": {"k": 1}}},
        {"metadata": "a"},
        [],
    ],
)
def test_namespace_without_usable_metadata_is_refused(body: Any) -> None:
    with pytest.raises(ValidationError):
        read_namespace(body)


def test_pod_reads_addresses_and_named_ports_and_forgets_finished_pods() -> None:
    body = {
        "metadata": meta("p", "a", {"app": "x"}),
        "spec": {
            "containers": [
                {"ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"}]},
                {"ports": [{"containerPort": 80}]},
            ]
        },
        "status": {"phase": "Running", "podIPs": [{"ip": "fd00::1"}, {"ip": "10.0.0.1"}]},
    }
    pod = read_pod(body)
    assert pod.ips == ("10.0.0.1", "fd00::1")
    assert pod.meta.resource_version == "1"
    assert [(p.name, p.protocol, p.number) for p in pod.named_ports] == [("dns", "UDP", 53)]
    body["status"]["phase"] = "Succeeded"
    assert read_pod(body).ips == ()


def test_pod_with_a_bad_address_is_refused() -> None:
    body = {"metadata": meta("p", "a"), "status": {"podIPs": [{"ip": "10.0.0.300"}]}}
    with pytest.raises(ValidationError, match="podIP"):
        read_pod(body)


labels = st.dictionaries(st.sampled_from("abc"), st.sampled_from("xyz"), max_size=3)


@given(labels, labels)
def test_match_labels_is_a_subset_test(wanted: dict[str, str], have: dict[str, str]) -> None:
    selector = read_selector({"matchLabels": wanted}, "s")
    assert selector.matches(have) == (wanted.items() <= have.items())


@given(st.sampled_from("abc"), st.lists(st.sampled_from("xyz"), min_size=1), labels)
def test_in_and_not_in_are_complements(key: str, values: list[str], have: dict[str, str]) -> None:
    def expression(operator: str) -> Any:
        return {"matchExpressions": [{"key": key, "operator": operator, "values": values}]}

    within = read_selector(expression("In"), "s").matches(have)
    assert within != read_selector(expression("NotIn"), "s").matches(have)
    exists = read_selector({"matchExpressions": [{"key": key, "operator": "Exists"}]}, "s")
    absent = read_selector({"matchExpressions": [{"key": key, "operator": "DoesNotExist"}]}, "s")
    assert exists.matches(have) == (key in have) != absent.matches(have)


@given(labels)
def test_selector_key_ignores_the_order_terms_were_written_in(wanted: dict[str, str]) -> None:
    forward = read_selector({"matchLabels": wanted}, "s")
    backward = read_selector({"matchLabels": dict(reversed(list(wanted.items())))}, "s")
    assert forward.key == backward.key
