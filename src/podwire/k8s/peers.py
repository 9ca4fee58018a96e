"""What one ``from``/``to`` entry of a policy stands for: the pods it names (to resolve named
ports on egress) and how a Neutron rule reaches them — an address group for selectors, the
complementary prefixes for an ipBlock, or any address for a rule without peers."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from podwire.k8s.cidrs import allowed_prefixes
from podwire.k8s.groups import DesiredAddressGroup, address_group_name
from podwire.k8s.netpol import IpNetwork, Peer
from podwire.k8s.objects import K8sNamespace, K8sPod, ObjectKey
from podwire.k8s.selectors import EVERYTHING


@dataclass(frozen=True)
class PeerSet:
    """``prefixes`` None with no address group: any address."""

    pods: tuple[K8sPod, ...]
    address_group: DesiredAddressGroup | None = None
    prefixes: tuple[IpNetwork, ...] | None = None


def peer_set(
    namespaces: Mapping[ObjectKey, K8sNamespace],
    pods: Mapping[ObjectKey, K8sPod],
    policy_namespace: str,
    peer: Peer | None,
) -> PeerSet:
    addressed = [pod for pod in pods.values() if pod.has_own_address]
    if peer is None:
        return PeerSet(tuple(addressed))
    if peer.ip_block is not None:
        prefixes = allowed_prefixes(peer.ip_block.cidr, peer.ip_block.excepts)
        inside = tuple(pod for pod in addressed if _inside_any(pod, prefixes))
        return PeerSet(inside, prefixes=prefixes)
    members = tuple(p for p in addressed if _names(namespaces, policy_namespace, peer, p))
    return PeerSet(members, address_group=_address_group(policy_namespace, peer, members))


def _names(
    namespaces: Mapping[ObjectKey, K8sNamespace], policy_namespace: str, peer: Peer, pod: K8sPod
) -> bool:
    """A pod selector alone means the policy's namespace; a namespace selector alone, every
    pod of the namespaces it selects (a namespace not yet cached selects none)."""
    namespace = pod.meta.key.namespace
    if peer.namespaces is None:
        in_scope = namespace == policy_namespace
    else:
        cached = namespaces.get(ObjectKey("", namespace))
        in_scope = cached is not None and peer.namespaces.matches(cached.meta.labels)
    return in_scope and (peer.pods or EVERYTHING).matches(pod.meta.labels)


def _address_group(
    policy_namespace: str, peer: Peer, members: tuple[K8sPod, ...]
) -> DesiredAddressGroup:
    """One per distinct selector pair: policies that name the same pods share it."""
    identity = json.dumps([_scope(policy_namespace, peer), (peer.pods or EVERYTHING).key])
    description = _peer_identity(policy_namespace, peer)[:255]
    return DesiredAddressGroup(address_group_name(identity), description, _addresses(members))


def _scope(policy_namespace: str, peer: Peer) -> str:
    if peer.namespaces is None:
        return f"namespace {policy_namespace}"
    return f"namespaces {peer.namespaces.key}"


def _addresses(members: Iterable[K8sPod]) -> frozenset[str]:
    return frozenset(str(ipaddress.ip_network(address)) for pod in members for address in pod.ips)


def named_port_members(
    policy_namespace: str, peer: Peer | None, found: PeerSet, port: tuple[str, str, int]
) -> DesiredAddressGroup:
    """The peers of ``found`` that give the named port ``port`` (name, protocol) the number
    it holds: an egress rule to a named port reaches each peer on that peer's own number."""
    name, protocol, number = port
    members = [
        pod
        for pod in found.pods
        if any((n.name, n.protocol, n.number) == port for n in pod.named_ports)
    ]
    identity = json.dumps([_peer_identity(policy_namespace, peer), name, protocol, number])
    description = f"{name}/{protocol}={number} of {_peer_identity(policy_namespace, peer)}"
    return DesiredAddressGroup(address_group_name(identity), description[:255], _addresses(members))


def _peer_identity(policy_namespace: str, peer: Peer | None) -> str:
    if peer is None:
        return "any pod"
    if peer.ip_block is not None:
        excepts = ",".join(str(net) for net in peer.ip_block.excepts)
        return f"pods in {peer.ip_block.cidr} except [{excepts}]"
    return f"pods {(peer.pods or EVERYTHING).key} in {_scope(policy_namespace, peer)}"


def _inside_any(pod: K8sPod, prefixes: tuple[IpNetwork, ...]) -> bool:
    return any(
        ipaddress.ip_address(address) in prefix for address in pod.ips for prefix in prefixes
    )
