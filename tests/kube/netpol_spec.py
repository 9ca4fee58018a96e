"""What the NetworkPolicy specification (networking.k8s.io/v1) allows, read straight from
the objects as the test applies them: the truth table's expected side. Written for the test
from the API reference, independently of podwire's compiler (``podwire.k8s``), which is what
the table checks.

A connection from pod S to pod D on (protocol, port) is allowed iff S may send it (egress)
and D may receive it (ingress). In each direction a pod no policy of its namespace selects
with that policy type is open; a selected pod is allowed exactly the union of the rules of
the policies that select it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

Spec = dict[str, Any]


@dataclass(frozen=True)
class Cell:
    source: str  # "namespace/name"
    target: str
    protocol: str  # "TCP" or "UDP"
    port: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} {self.protocol}/{self.port}"


@dataclass
class Pod:
    namespace: str
    name: str
    labels: dict[str, str]
    # (name, protocol, number) of each containerPort: what a named port means on this pod.
    ports: tuple[tuple[str, str, int], ...] = ()
    ip: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class World:
    """The namespaces' labels, the pods and the policies, as last applied."""

    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    policies: dict[tuple[str, str], Spec] = field(default_factory=dict)

    def allowed(self, cell: Cell) -> bool:
        source, target = self.pods[cell.source], self.pods[cell.target]
        return self._direction(source, target, target, cell, "Egress") and self._direction(
            target, source, target, cell, "Ingress"
        )

    def _direction(self, pod: Pod, peer: Pod, dest: Pod, cell: Cell, kind: str) -> bool:
        """Whether ``pod``'s policies of type ``kind`` let it talk with ``peer``; named ports
        are read on ``dest``, the pod the traffic goes to."""
        selecting = [
            spec
            for (namespace, _), spec in self.policies.items()
            if namespace == pod.namespace
            and kind in policy_types(spec)
            and matches(spec.get("podSelector", {}), pod.labels)
        ]
        if not selecting:
            return True
        rules_key, peers_key = ("ingress", "from") if kind == "Ingress" else ("egress", "to")
        return any(
            self._peers_match(rule.get(peers_key), peer, pod.namespace)
            and ports_match(rule.get("ports"), dest, cell)
            for spec in selecting
            for rule in spec.get(rules_key) or []
        )

    def _peers_match(self, peers: list[Spec] | None, peer: Pod, namespace: str) -> bool:
        if not peers:
            return True
        return any(self._peer_matches(one, peer, namespace) for one in peers)

    def _peer_matches(self, peer_spec: Spec, peer: Pod, namespace: str) -> bool:
        if "ipBlock" in peer_spec:
            return in_block(peer_spec["ipBlock"], peer.ip)
        if "namespaceSelector" in peer_spec:
            labels = self.namespaces[peer.namespace]
            if not matches(peer_spec["namespaceSelector"], labels):
                return False
        elif peer.namespace != namespace:
            return False
        return matches(peer_spec.get("podSelector", {}), peer.labels)


def policy_types(spec: Spec) -> list[str]:
    if "policyTypes" in spec:
        return list(spec["policyTypes"])
    return ["Ingress", "Egress"] if "egress" in spec else ["Ingress"]


def matches(selector: Spec, labels: dict[str, str]) -> bool:
    """A LabelSelector: every matchLabels pair and every expression must hold."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    return all(_expression(expr, labels) for expr in selector.get("matchExpressions", []))


def _expression(expr: Spec, labels: dict[str, str]) -> bool:
    key, operator, values = expr["key"], expr["operator"], expr.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise ValueError(f"unknown operator {operator}")


def in_block(block: Spec, address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if ip not in ipaddress.ip_network(block["cidr"], strict=False):
        return False
    return not any(ip in ipaddress.ip_network(net, strict=False) for net in block.get("except", []))


def ports_match(ports: list[Spec] | None, dest: Pod, cell: Cell) -> bool:
    if not ports:
        return True
    return any(_port_matches(one, dest, cell) for one in ports)


def _port_matches(port: Spec, dest: Pod, cell: Cell) -> bool:
    protocol = port.get("protocol", "TCP")
    if protocol != cell.protocol:
        return False
    number = port.get("port")
    if number is None:
        return True
    if isinstance(number, str):
        return (number, protocol, cell.port) in dest.ports
    end = port.get("endPort") or number
    return int(number) <= cell.port <= int(end)
