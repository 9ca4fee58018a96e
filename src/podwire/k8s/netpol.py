"""NetworkPolicy (networking.k8s.io/v1) as values, and its strict reader.

The reader keeps the whole spec the compiler needs and refuses what it cannot compile
(an ipBlock ``except`` outside its ``cidr``, an ``endPort`` on a named port or below its
port, more rules or peers than podwire takes), naming the field. Skipping such a policy would
leave its pods open, more open than it asked, so the informer keeps it closed instead
(``read_policy_or_closed``): its pods isolated in its directions and allowed nothing by it,
and the reconciler names the refusal on the policy."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from podwire.errors import ValidationError
from podwire.k8s.objects import PROTOCOLS, Meta, read_meta
from podwire.k8s.selectors import EVERYTHING, Selector, read_selector
from podwire.schema import fields
from podwire.schema.doc import as_object

INGRESS = "Ingress"
EGRESS = "Egress"
MAX_RULES = 256
MAX_PEERS = 256
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class IpBlock:
    cidr: IpNetwork
    excepts: tuple[IpNetwork, ...] = ()


@dataclass(frozen=True)
class Peer:
    """One ``from``/``to`` entry: pods (in namespaces) or an ipBlock, never both.

    ``namespaces`` None means the policy's own namespace; ``pods`` None means every pod of
    the selected namespaces."""

    pods: Selector | None = None
    namespaces: Selector | None = None
    ip_block: IpBlock | None = None


@dataclass(frozen=True)
class PolicyPort:
    """A port number or a port name (resolved against pods), or neither: every port."""

    protocol: str = "TCP"
    number: int | None = None
    name: str | None = None
    end: int | None = None


@dataclass(frozen=True)
class PolicyRule:
    """``peers`` None allows every peer (the rule has no from/to); ``ports`` None every port."""

    peers: tuple[Peer, ...] | None
    ports: tuple[PolicyPort, ...] | None


@dataclass(frozen=True)
class NetworkPolicy:
    """``refused``: why the strict reader refused it; its rules are then empty (closed)."""

    meta: Meta
    pod_selector: Selector
    types: frozenset[str]
    ingress: tuple[PolicyRule, ...]
    egress: tuple[PolicyRule, ...]
    refused: str | None = None

    def not_enforced(self) -> str | None:
        """What its Event says when podwire could not read it."""
        if self.refused is None:
            return None
        return (
            f"podwire cannot read this policy ({self.refused}); its pods are isolated as it"
            " says but allowed nothing by it until it is changed"
        )


def read_network_policy(value: Any) -> NetworkPolicy:
    body = as_object(value, "networkpolicy")
    meta = read_meta(body.get("metadata"), "networkpolicy", namespaced=True)
    what = f"networkpolicy {meta.key}"
    spec = as_object(body.get("spec"), f"{what}.spec")
    ingress = _rules(spec.get("ingress"), f"{what}.spec.ingress", "from")
    egress = _rules(spec.get("egress"), f"{what}.spec.egress", "to")
    return NetworkPolicy(
        meta=meta,
        pod_selector=read_selector(spec.get("podSelector") or {}, f"{what}.spec.podSelector"),
        types=_types(spec, what),
        ingress=ingress,
        egress=egress,
    )


def read_policy_or_closed(value: Any) -> NetworkPolicy:
    """The policy, or, when the strict reader refuses it, the policy closed: the pods its
    selector names (every pod of its namespace if that cannot be read either) isolated in its
    directions (both if they cannot be read). Only a body without usable metadata is refused
    (no key to keep it under)."""
    try:
        return read_network_policy(value)
    except ValidationError as exc:
        return _closed(value, str(exc))


def _closed(value: Any, reason: str) -> NetworkPolicy:
    body = as_object(value, "networkpolicy")
    meta = read_meta(body.get("metadata"), "networkpolicy", namespaced=True)
    what = f"networkpolicy {meta.key}"
    raw = body.get("spec")
    spec: dict[str, Any] = raw if isinstance(raw, dict) else {}
    try:
        selector = read_selector(spec.get("podSelector") or {}, f"{what}.spec.podSelector")
    except ValidationError:
        selector = EVERYTHING
    try:
        types = _types(spec, what)
    except ValidationError:
        types = frozenset([INGRESS, EGRESS])
    return NetworkPolicy(meta, selector, types, (), (), refused=reason)


def _types(spec: dict[str, Any], what: str) -> frozenset[str]:
    """The API's default: Ingress always, Egress when the policy has egress rules."""
    raw = spec.get("policyTypes")
    if raw is None:
        return frozenset([INGRESS, EGRESS] if spec.get("egress") else [INGRESS])
    where = f"{what}.spec.policyTypes"
    listed = fields.items(raw, where, 2)
    return frozenset(fields.one_of(item, where, (INGRESS, EGRESS)) for item in listed)


def _rules(value: Any, what: str, peers_field: str) -> tuple[PolicyRule, ...]:
    rules = []
    for index, item in enumerate(fields.items(value or [], what, MAX_RULES)):
        where = f"{what}[{index}]"
        body = as_object(item, where)
        peers = body.get(peers_field)
        ports = body.get("ports")
        rules.append(
            PolicyRule(
                peers=None if not peers else _each(peers, f"{where}.{peers_field}", _peer),
                ports=None if not ports else _each(ports, f"{where}.ports", _port),
            )
        )
    return tuple(rules)


def _each(value: Any, what: str, read: Any) -> tuple[Any, ...]:
    return tuple(fields.each(value, what, read, MAX_PEERS))


def _peer(value: Any, what: str) -> Peer:
    body = as_object(value, what)
    block = body.get("ipBlock")
    pods, namespaces = body.get("podSelector"), body.get("namespaceSelector")
    if block is not None:
        if pods is not None or namespaces is not None:
            raise fields.fail(what, "an ipBlock peer takes no selectors")
        return Peer(ip_block=_ip_block(block, f"{what}.ipBlock"))
    if pods is None and namespaces is None:
        raise fields.fail(what, "names no podSelector, namespaceSelector or ipBlock")
    return Peer(
        pods=None if pods is None else read_selector(pods, f"{what}.podSelector"),
        namespaces=None
        if namespaces is None
        else read_selector(namespaces, f"{what}.namespaceSelector"),
    )


def _ip_block(value: Any, what: str) -> IpBlock:
    body = as_object(value, what)
    cidr = _cidr(body.get("cidr"), f"{what}.cidr")
    excepts = fields.each(body.get("except") or [], f"{what}.except", _cidr, MAX_PEERS)
    for item in excepts:
        if not _inside(item, cidr):
            raise fields.fail(what, f"except {item} is not inside {cidr}")
    return IpBlock(cidr, tuple(sorted(set(excepts), key=str)))


def _cidr(value: Any, what: str) -> IpNetwork:
    """The API takes a CIDR with host bits set (10.0.0.1/24); it means its network."""
    if not isinstance(value, str) or len(value) > 64:
        raise fields.fail(what, f"{value!r:.80} is not a CIDR")
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        raise fields.fail(what, f"{value!r} is not a CIDR: {exc}") from exc


def _inside(inner: IpNetwork, outer: IpNetwork) -> bool:
    if isinstance(inner, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return inner.subnet_of(outer)
    if isinstance(inner, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return inner.subnet_of(outer)
    return False


def _port(value: Any, what: str) -> PolicyPort:
    body = as_object(value, what)
    protocol = fields.one_of(body.get("protocol", "TCP"), f"{what}.protocol", PROTOCOLS)
    raw, end = body.get("port"), body.get("endPort")
    if isinstance(raw, str):
        if end is not None:
            raise fields.fail(what, "endPort needs a numeric port")
        return PolicyPort(protocol, name=fields.text(raw, f"{what}.port", 15, empty=False))
    number = fields.optional(raw, f"{what}.port", _port_number)
    if end is not None:
        if number is None:
            raise fields.fail(what, "endPort needs a port")
        end = fields.integer(end, f"{what}.endPort", number, 65535)
    return PolicyPort(protocol, number=number, end=end)


def _port_number(value: Any, what: str) -> int:
    return fields.integer(value, what, 1, 65535)
