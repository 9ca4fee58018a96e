"""NetworkPolicies to Neutron security groups: pure, from the informers' cached objects.

One group per policy holds the rules of the directions the policy isolates; pod and
namespace selectors become address groups (shared by every rule with the same selector), so
a pod joining a selector changes one address group, not a rule per pod. A pod's port carries
the groups of every policy that selects it, plus an open group for each direction no policy
selects it in: a pod selected in a direction is default-deny there and allowed the union of
its policies' rules; an unselected pod is open."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from podwire.k8s.groups import (
    EGRESS,
    ETHERTYPES,
    INGRESS,
    IPV4,
    IPV6,
    OPEN_EGRESS,
    OPEN_INGRESS,
    DesiredAddressGroup,
    DesiredGroup,
    DesiredPolicy,
    PodPolicies,
    SgRule,
    group_name,
    open_group,
)
from podwire.k8s.netpol import EGRESS as EGRESS_TYPE
from podwire.k8s.netpol import INGRESS as INGRESS_TYPE
from podwire.k8s.netpol import NetworkPolicy, Peer, PolicyPort, PolicyRule
from podwire.k8s.objects import K8sNamespace, K8sPod, ObjectKey
from podwire.k8s.peers import PeerSet, peer_set

PortRange = tuple[str | None, int | None, int | None]
EVERY_PORT: tuple[PortRange, ...] = ((None, None, None),)


@dataclass(frozen=True)
class Cluster:
    """The cached objects the compiler reads, keyed as the informers keep them."""

    namespaces: Mapping[ObjectKey, K8sNamespace]
    pods: Mapping[ObjectKey, K8sPod]
    policies: Mapping[ObjectKey, NetworkPolicy]


def compile_policies(cluster: Cluster) -> DesiredPolicy:
    desired = DesiredPolicy()
    for direction in (INGRESS, EGRESS):
        group = open_group(direction)
        desired.groups[group.name] = group
    for policy in sorted(cluster.policies.values(), key=lambda p: str(p.meta.key)):
        group = _policy_group(cluster, policy, desired.address_groups)
        desired.groups[group.name] = group
    for pod in cluster.pods.values():
        if not pod.host_network:
            desired.pods[pod.meta.key] = pod_policies(cluster.policies.values(), pod)
    return desired


def selects(policy: NetworkPolicy, pod: K8sPod) -> bool:
    return policy.meta.key.namespace == pod.meta.key.namespace and policy.pod_selector.matches(
        pod.meta.labels
    )


def pod_policies(policies: Iterable[NetworkPolicy], pod: K8sPod) -> PodPolicies:
    """Decided from the pod's labels alone, so a new pod's groups are known before its port."""
    chosen = [policy for policy in policies if selects(policy, pod)]
    ingress = frozenset(p.meta.key for p in chosen if INGRESS_TYPE in p.types)
    egress = frozenset(p.meta.key for p in chosen if EGRESS_TYPE in p.types)
    groups = {group_name(p.meta.key) for p in chosen if p.types}
    if not ingress:
        groups.add(OPEN_INGRESS)
    if not egress:
        groups.add(OPEN_EGRESS)
    return PodPolicies(ingress, egress, frozenset(groups))


def _policy_group(
    cluster: Cluster, policy: NetworkPolicy, address_groups: dict[str, DesiredAddressGroup]
) -> DesiredGroup:
    rules: set[SgRule] = set()
    selected = [pod for pod in cluster.pods.values() if selects(policy, pod)]
    for direction, kind, policy_rules in (
        (INGRESS, INGRESS_TYPE, policy.ingress),
        (EGRESS, EGRESS_TYPE, policy.egress),
    ):
        if kind not in policy.types:
            continue
        for rule in policy_rules:
            rules.update(_rules(cluster, policy, direction, rule, selected, address_groups))
    key = policy.meta.key
    return DesiredGroup(group_name(key), f"NetworkPolicy {key}", frozenset(rules))


def _rules(
    cluster: Cluster,
    policy: NetworkPolicy,
    direction: str,
    rule: PolicyRule,
    selected: list[K8sPod],
    address_groups: dict[str, DesiredAddressGroup],
) -> Iterable[SgRule]:
    peers: tuple[Peer | None, ...] = rule.peers if rule.peers is not None else (None,)
    for peer in peers:
        found = peer_set(cluster.namespaces, cluster.pods, policy.meta.key.namespace, peer)
        if found.address_group is not None:
            address_groups[found.address_group.name] = found.address_group
        # A named port is the destination's: the selected pods' on ingress, the peers' on egress.
        owners = selected if direction == INGRESS else found.pods
        for port in _port_ranges(rule.ports, owners):
            yield from _remote_rules(direction, port, found)


def _remote_rules(direction: str, port: PortRange, found: PeerSet) -> Iterable[SgRule]:
    protocol, low, high = port
    if found.address_group is not None:
        for ethertype in ETHERTYPES:
            yield SgRule(
                direction,
                ethertype,
                protocol,
                low,
                high,
                remote_address_group=found.address_group.name,
            )
        return
    if found.prefixes is None:
        for ethertype in ETHERTYPES:
            yield SgRule(direction, ethertype, protocol, low, high)
        return
    for prefix in found.prefixes:
        ethertype = IPV4 if prefix.version == 4 else IPV6
        remote = str(prefix) if prefix.prefixlen else None  # a whole family: no remote
        yield SgRule(direction, ethertype, protocol, low, high, remote_ip_prefix=remote)


def _port_ranges(ports: tuple[PolicyPort, ...] | None, owners: Iterable[K8sPod]) -> list[PortRange]:
    if ports is None:
        return list(EVERY_PORT)
    owners = list(owners)
    ranges: set[PortRange] = set()
    for port in ports:
        protocol = port.protocol.lower()
        if port.name is not None:
            ranges.update(
                (protocol, named.number, named.number)
                for pod in owners
                for named in pod.named_ports
                if named.name == port.name and named.protocol == port.protocol
            )
        elif port.number is None:
            ranges.add((protocol, None, None))
        else:
            ranges.add((protocol, port.number, port.end or port.number))
    return sorted(ranges, key=lambda r: (r[0] or "", r[1] or 0, r[2] or 0))
