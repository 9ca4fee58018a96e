"""The NetworkPolicy compiler: isolation, selectors as address groups, ipBlocks, ports."""

from __future__ import annotations

from podwire.k8s.compile import compile_policies
from podwire.k8s.groups import (
    OPEN_EGRESS,
    OPEN_INGRESS,
    DesiredPolicy,
    SgRule,
    group_name,
    named_port_group_name,
)
from tests.k8s.objects import cluster, key, namespace, pod, policy

NAMESPACES = [namespace("a", team="blue"), namespace("b", team="red"), namespace("c")]
PODS = [
    pod("a", "web", ["10.0.0.1"], {"app": "web"}, [{"name": "http", "containerPort": 8080}]),
    pod("a", "db", ["10.0.0.2", "fd00::2"], {"app": "db", "tier": "back"}),
    pod("b", "client", ["10.0.1.1"], {"app": "client"}),
    pod("c", "other", ["10.0.2.1"], {"app": "web"}, [{"name": "http", "containerPort": 9090}]),
]


def compiled(*policies: object) -> DesiredPolicy:
    return compile_policies(cluster(NAMESPACES, PODS, list(policies)))  # type: ignore[arg-type]


def rules_of(desired: DesiredPolicy, namespace_: str, name: str) -> set[SgRule]:
    return set(desired.groups[group_name(key(namespace_, name))].rules)


def test_no_policy_leaves_every_pod_open() -> None:
    desired = compiled()
    assert set(desired.groups) == {OPEN_INGRESS, OPEN_EGRESS}
    for pods in desired.pods.values():
        assert pods.groups == {OPEN_INGRESS, OPEN_EGRESS}
        assert not pods.ingress and not pods.egress


def test_default_deny_ingress_isolates_only_ingress_of_selected_pods() -> None:
    desired = compiled(policy("a", "deny", {"podSelector": {}}))
    name = group_name(key("a", "deny"))
    assert desired.groups[name].rules == frozenset()
    for pod_name in ("web", "db"):
        assert desired.pods[key("a", pod_name)].groups == {name, OPEN_EGRESS}
    assert desired.pods[key("b", "client")].groups == {OPEN_INGRESS, OPEN_EGRESS}


def test_default_deny_egress_keeps_ingress_open() -> None:
    desired = compiled(policy("a", "deny", {"podSelector": {}, "policyTypes": ["Egress"]}))
    assert desired.pods[key("a", "web")].groups == {group_name(key("a", "deny")), OPEN_INGRESS}


def test_a_rule_for_a_type_not_listed_is_ignored() -> None:
    spec = {"podSelector": {}, "policyTypes": ["Ingress"], "egress": [{}]}
    desired = compiled(policy("a", "p", spec))
    assert rules_of(desired, "a", "p") == set()
    assert OPEN_EGRESS in desired.pods[key("a", "web")].groups


def test_policy_types_default_to_egress_when_egress_rules_exist() -> None:
    desired = compiled(policy("a", "p", {"podSelector": {}, "egress": [{}]}))
    assert desired.pods[key("a", "web")].groups == {group_name(key("a", "p"))}
    assert {r.direction for r in rules_of(desired, "a", "p")} == {"egress"}


def test_an_empty_rule_allows_everything_in_both_families() -> None:
    desired = compiled(policy("a", "p", {"podSelector": {}, "ingress": [{}]}))
    assert rules_of(desired, "a", "p") == {SgRule("ingress", "IPv4"), SgRule("ingress", "IPv6")}


def test_pod_selector_becomes_an_address_group_of_its_namespace() -> None:
    spec = {
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}],
    }
    desired = compiled(policy("a", "p", spec))
    (group,) = desired.address_groups.values()
    assert group.addresses == {"10.0.0.1/32"}  # c/other matches the labels, not the namespace
    assert rules_of(desired, "a", "p") == {
        SgRule("ingress", family, remote_address_group=group.name) for family in ("IPv4", "IPv6")
    }
    assert {r.remote_address_group for r in rules_of(desired, "a", "p")} == {group.name}
    assert desired.pods[key("a", "db")].ingress == {key("a", "p")}
    assert desired.pods[key("a", "web")].ingress == frozenset()


def test_namespace_selector_takes_every_pod_of_matching_namespaces() -> None:
    spec = {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}
    (group,) = compiled(policy("a", "p", spec)).address_groups.values()
    assert group.addresses == {
        "10.0.0.1/32",
        "10.0.0.2/32",
        "fd00::2/128",
        "10.0.1.1/32",
        "10.0.2.1/32",
    }


def test_namespace_and_pod_selector_together_intersect() -> None:
    peer = {
        "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
        "podSelector": {
            "matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]
        },
    }
    spec = {"podSelector": {}, "ingress": [{"from": [peer]}]}
    (group,) = compiled(policy("c", "p", spec)).address_groups.values()
    assert group.addresses == {"10.0.0.2/32", "fd00::2/128", "10.0.1.1/32"}


def test_policies_with_the_same_selector_share_one_address_group() -> None:
    spec = {
        "podSelector": {},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}],
    }
    desired = compiled(policy("a", "p", spec), policy("a", "q", spec), policy("c", "r", spec))
    assert len(desired.address_groups) == 2  # namespace a's selector, namespace c's


def test_ip_block_with_two_excepts_becomes_the_complementary_prefixes() -> None:
    block = {"cidr": "192.168.0.0/24", "except": ["192.168.0.0/26", "192.168.0.128/26"]}
    spec = {
        "podSelector": {},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": block}], "ports": [{"protocol": "UDP", "port": 53}]}],
    }
    rules = rules_of(compiled(policy("a", "p", spec)), "a", "p")
    assert {r.remote_ip_prefix for r in rules} == {"192.168.0.64/26", "192.168.0.192/26"}
    assert {(r.ethertype, r.protocol, r.port_min, r.port_max) for r in rules} == {
        ("IPv4", "udp", 53, 53)
    }


def test_end_port_and_protocols() -> None:
    ports = [
        {"port": 1000, "endPort": 2000},
        {"protocol": "SCTP", "port": 5000},
        {"protocol": "UDP"},
    ]
    spec = {"podSelector": {}, "ingress": [{"ports": ports}]}
    rules = rules_of(compiled(policy("a", "p", spec)), "a", "p")
    assert {(r.protocol, r.port_min, r.port_max) for r in rules} == {
        ("tcp", 1000, 2000),
        ("sctp", 5000, 5000),
        ("udp", None, None),
    }


def test_named_port_on_ingress_resolves_on_the_selected_pods() -> None:
    spec = {
        "podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"ports": [{"port": "http"}]}],
    }
    desired = compiled(policy("a", "p", spec))
    named = named_port_group_name(key("a", "p"), (("http", "TCP", 8080),))
    assert {(r.protocol, r.port_min) for r in desired.groups[named].rules} == {("tcp", 8080)}
    assert rules_of(desired, "a", "p") == set()  # the policy's own group: no named rule
    assert desired.pods[key("a", "web")].groups == {
        group_name(key("a", "p")),
        named,
        OPEN_EGRESS,
    }


def test_a_named_port_on_ingress_reaches_each_selected_pod_on_its_own_number() -> None:
    """Two pods selected by one policy give "http" different numbers: each gets a group
    that opens its own number only (not the union toward both)."""
    other = pod(
        "a", "web2", ["10.0.0.3"], {"app": "web"}, [{"name": "http", "containerPort": 9090}]
    )
    spec = {
        "podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"ports": [{"port": "http"}, {"port": 7000}]}],
    }
    desired = compile_policies(cluster(NAMESPACES, [*PODS, other], [policy("a", "p", spec)]))
    for name, number in (("web", 8080), ("web2", 9090)):
        (named,) = desired.pods[key("a", name)].groups - {
            group_name(key("a", "p")),
            OPEN_EGRESS,
        }
        assert {r.port_min for r in desired.groups[named].rules} == {number}
    assert {r.port_min for r in rules_of(desired, "a", "p")} == {7000}


def test_named_port_on_egress_resolves_on_the_peers() -> None:
    """Each peer on its own number: a rule per number toward the peers that give it."""
    spec = {
        "podSelector": {},
        "policyTypes": ["Egress"],
        "egress": [
            {
                "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}],
                "ports": [{"port": "http"}],
            }
        ],
    }
    desired = compiled(policy("b", "p", spec))
    rules = rules_of(desired, "b", "p")
    reached = {
        (
            r.port_min,
            r.port_max,
            frozenset(desired.address_groups[r.remote_address_group].addresses),
        )
        for r in rules
        if r.remote_address_group is not None
    }
    assert reached == {
        (8080, 8080, frozenset({"10.0.0.1/32"})),
        (9090, 9090, frozenset({"10.0.2.1/32"})),
    }
    assert len(rules) == 4  # IPv4 and IPv6 of each


def test_a_named_port_no_pod_has_allows_nothing() -> None:
    spec = {"podSelector": {}, "ingress": [{"ports": [{"port": "nope"}]}]}
    assert rules_of(compiled(policy("a", "p", spec)), "a", "p") == set()


def test_two_policies_union_and_the_pod_carries_both() -> None:
    one = {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{"ports": [{"port": 1}]}]}
    two = {"podSelector": {"matchLabels": {"tier": "back"}}, "ingress": [{"ports": [{"port": 2}]}]}
    desired = compiled(policy("a", "one", one), policy("a", "two", two))
    assert desired.pods[key("a", "db")].groups == {
        group_name(key("a", "one")),
        group_name(key("a", "two")),
        OPEN_EGRESS,
    }


def test_host_network_pods_are_neither_members_nor_targets() -> None:
    pods = [*PODS, pod("a", "host", ["192.0.2.1"], {"app": "web"}, host_network=True)]
    spec = {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}
    desired = compile_policies(cluster(NAMESPACES, pods, [policy("a", "p", spec)]))
    (group,) = desired.address_groups.values()
    assert "192.0.2.1/32" not in group.addresses
    assert key("a", "host") not in desired.pods


def test_a_pod_without_an_address_yet_already_has_its_groups() -> None:
    pods = [*PODS, pod("a", "new", [], {"app": "web"})]
    desired = compile_policies(cluster(NAMESPACES, pods, [policy("a", "p", {"podSelector": {}})]))
    assert desired.pods[key("a", "new")].groups == {group_name(key("a", "p")), OPEN_EGRESS}
