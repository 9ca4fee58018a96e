"""NetworkPolicies to Neutron security groups: pure, from the informers' cached objects.

One group per policy holds the rules of the directions the policy isolates (but its named
ports on ingress, in a group per meaning the selected pods give them); pod and
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
    named_port_group_name,
    open_group,
)
from podwire.k8s.netpol import EGRESS as EGRESS_TYPE
from podwire.k8s.netpol import INGRESS as INGRESS_TYPE
from podwire.k8s.netpol import NetworkPolicy, Peer, PolicyPort, PolicyRule
from podwire.k8s.objects import K8sNamespace, K8sPod, ObjectKey
from podwire.k8s.peers import PeerSet, named_port_members, peer_set

PortRange = tuple[str | None, int | None, int | None]
EVERY_PORT: tuple[PortRange, ...] = ((None, None, None),)
NamedNumbers = tuple[tuple[str, str, int], ...]


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
        for group in _policy_groups(cluster, policy, desired.address_groups):
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
    """Decided from the pod's labels and its own named ports alone, so a new pod's groups are
    known before its port."""
    chosen = [policy for policy in policies if selects(policy, pod)]
    ingress = frozenset(p.meta.key for p in chosen if INGRESS_TYPE in p.types)
    egress = frozenset(p.meta.key for p in chosen if EGRESS_TYPE in p.types)
    groups = {group_name(p.meta.key) for p in chosen if p.types}
    for policy in chosen:
        if numbers := ingress_numbers(policy, pod):
            groups.add(named_port_group_name(policy.meta.key, numbers))
    if not ingress:
        groups.add(OPEN_INGRESS)
    if not egress:
        groups.add(OPEN_EGRESS)
    return PodPolicies(ingress, egress, frozenset(groups))


def ingress_numbers(policy: NetworkPolicy, pod: K8sPod) -> NamedNumbers:
    """What the port names of the policy's ingress rules mean on ``pod`` (empty: it has none
    of them). Pods that agree share one group of those rules; a pod that names a port
    otherwise gets a group of its own, so each is reached on its own number only."""
    if INGRESS_TYPE not in policy.types:
        return ()
    used = {
        (port.name, port.protocol)
        for rule in policy.ingress
        for port in rule.ports or ()
        if port.name is not None
    }
    return tuple(
        sorted(
            (n.name, n.protocol, n.number) for n in pod.named_ports if (n.name, n.protocol) in used
        )
    )


def _policy_groups(
    cluster: Cluster, policy: NetworkPolicy, address_groups: dict[str, DesiredAddressGroup]
) -> list[DesiredGroup]:
    """The policy's group (every rule but those of named ports on ingress), and a group per
    meaning its selected pods give those names."""
    rules: set[SgRule] = set()
    for direction, kind, policy_rules in (
        (INGRESS, INGRESS_TYPE, policy.ingress),
        (EGRESS, EGRESS_TYPE, policy.egress),
    ):
        if kind not in policy.types:
            continue
        for rule in policy_rules:
            rules.update(_rules(cluster, policy, direction, rule, address_groups))
    key = policy.meta.key
    groups = [DesiredGroup(group_name(key), f"NetworkPolicy {key}", frozenset(rules), key)]
    selected = [pod for pod in cluster.pods.values() if selects(policy, pod)]
    for numbers in sorted({ingress_numbers(policy, pod) for pod in selected} - {()}):
        named: set[SgRule] = set()
        for rule in policy.ingress:
            named.update(_named_ingress_rules(cluster, policy, rule, numbers, address_groups))
        meaning = ", ".join(f"{name}/{protocol}={number}" for name, protocol, number in numbers)
        description = f"NetworkPolicy {key} where {meaning}"[:255]
        groups.append(
            DesiredGroup(named_port_group_name(key, numbers), description, frozenset(named), key)
        )
    return groups


def _found(
    cluster: Cluster,
    policy: NetworkPolicy,
    peer: Peer | None,
    address_groups: dict[str, DesiredAddressGroup],
) -> PeerSet:
    found = peer_set(cluster.namespaces, cluster.pods, policy.meta.key.namespace, peer)
    if found.address_group is not None:
        address_groups[found.address_group.name] = found.address_group
    return found


def _peers(rule: PolicyRule) -> tuple[Peer | None, ...]:
    return rule.peers if rule.peers is not None else (None,)


def _rules(
    cluster: Cluster,
    policy: NetworkPolicy,
    direction: str,
    rule: PolicyRule,
    address_groups: dict[str, DesiredAddressGroup],
) -> Iterable[SgRule]:
    numbered = _numbered_ranges(rule.ports)
    named = [port for port in rule.ports or () if port.name is not None]
    for peer in _peers(rule):
        if numbered:
            found = _found(cluster, policy, peer, address_groups)
            for port in numbered:
                yield from _remote_rules(direction, port, found)
        if direction == EGRESS and named:
            peers = peer_set(cluster.namespaces, cluster.pods, policy.meta.key.namespace, peer)
            yield from _named_egress_rules(policy, peer, peers, named, address_groups)


def _named_ingress_rules(
    cluster: Cluster,
    policy: NetworkPolicy,
    rule: PolicyRule,
    numbers: NamedNumbers,
    address_groups: dict[str, DesiredAddressGroup],
) -> Iterable[SgRule]:
    wanted = sorted(
        (protocol.lower(), number, number)
        for port in rule.ports or ()
        for name, protocol, number in numbers
        if (port.name, port.protocol) == (name, protocol)
    )
    if not wanted:
        return
    for peer in _peers(rule):
        found = _found(cluster, policy, peer, address_groups)
        for port in wanted:
            yield from _remote_rules(INGRESS, port, found)


def _named_egress_rules(
    policy: NetworkPolicy,
    peer: Peer | None,
    found: PeerSet,
    named: list[PolicyPort],
    address_groups: dict[str, DesiredAddressGroup],
) -> Iterable[SgRule]:
    """A named port on egress is each peer's own: a rule per number, toward the address
    group of the peers that give the name that number."""
    for port in named:
        numbers = {
            n.number
            for pod in found.pods
            for n in pod.named_ports
            if (n.name, n.protocol) == (port.name, port.protocol)
        }
        for number in sorted(numbers):
            assert port.name is not None
            members = named_port_members(
                policy.meta.key.namespace, peer, found, (port.name, port.protocol, number)
            )
            address_groups[members.name] = members
            for ethertype in ETHERTYPES:
                yield SgRule(
                    EGRESS,
                    ethertype,
                    port.protocol.lower(),
                    number,
                    number,
                    remote_address_group=members.name,
                )


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


def _numbered_ranges(ports: tuple[PolicyPort, ...] | None) -> list[PortRange]:
    """The ranges of the ports given by number (or by protocol alone); named ports apart."""
    if ports is None:
        return list(EVERY_PORT)
    ranges: set[PortRange] = set()
    for port in ports:
        protocol = port.protocol.lower()
        if port.name is not None:
            continue
        if port.number is None:
            ranges.add((protocol, None, None))
        else:
            ranges.add((protocol, port.number, port.end or port.number))
    return sorted(ranges, key=lambda r: (r[0] or "", r[1] or 0, r[2] or 0))
