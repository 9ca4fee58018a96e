"""What a pod's own network namespace holds to reach ClusterIP Services: one nftables table,
``ip podwire_services``, translating a connection's first packet to one ready backend.

The translation happens in the client pod, before its packet reaches its port: the packet
leaves with the backend's address, so the client's security groups (egress) and the
backend's (ingress) judge the connection the Service carries exactly as they judge a direct
one, the reply comes back to the client whichever node the backend is on, and the client's
conntrack turns it back into the ClusterIP's. A pod gets only the backends on its own
network (and those outside every network): on overlapping tenant networks an address means
a different pod on each.

Layout: a verdict map ``services`` from (ClusterIP, protocol, port) to one chain per Service
port, whose one rule picks a backend (``numgen random``, or ``jhash`` of the client address
for ClientIP affinity: a pod is one client, so it keeps its backend while the set stays);
a Service port without backends for this pod is in the set ``unreachable`` and its packets
are rejected where they are made, so the client learns at once instead of after a timeout
(a TCP connect is refused, a UDP send fails "Operation not permitted"), as kube-proxy
refuses such a Service. A change of one Service
replaces its chains and elements in one transaction: no connection sees half of it, and no
other Service is touched."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from podwire.schema.services import HOST_NETWORK, ServiceEntry

TABLE = "podwire_services"
FAMILY = "ip"
NAT_PRIORITY = -100  # dstnat: before routing picks the way out
FILTER_PRIORITY = 0


@dataclass(frozen=True)
class PodPort:
    """One Service port as one pod sees it: the backends it can reach."""

    ip: str
    protocol: str
    port: int
    backends: tuple[tuple[str, int], ...]

    @property
    def element(self) -> str:
        return f"{self.ip} . {self.protocol} . {self.port}"


@dataclass(frozen=True)
class PodService:
    ports: tuple[PodPort, ...]
    affinity: bool


def for_network(entry: ServiceEntry, network: str) -> PodService:
    """What of ``entry`` a pod on ``network`` gets."""
    ports = []
    for port in entry.ports:
        backends = tuple(
            (b.address, b.port) for b in port.backends if b.network in (network, HOST_NETWORK)
        )
        for ip in entry.ips:
            ports.append(PodPort(ip, port.protocol, port.port, backends))
    return PodService(tuple(ports), entry.affinity)


def chain_name(key: str, port: PodPort) -> str:
    """Stable and short: the Service's key and the port, hashed (names are free text)."""
    digest = hashlib.sha256(f"{key} {port.element}".encode()).hexdigest()[:16]
    return f"s_{digest}"


def whole(services: Mapping[str, PodService]) -> str:
    """The table from scratch, replacing whatever a table of that name held."""
    lines = [
        f"add table {FAMILY} {TABLE}",
        f"delete table {FAMILY} {TABLE}",
        f"add table {FAMILY} {TABLE}",
        f"add map {FAMILY} {TABLE} services"
        " { type ipv4_addr . inet_proto . inet_service : verdict; }",
        f"add set {FAMILY} {TABLE} unreachable {{ type ipv4_addr . inet_proto . inet_service; }}",
        f"add chain {FAMILY} {TABLE} translate"
        f" {{ type nat hook output priority {NAT_PRIORITY}; policy accept; }}",
        f"add rule {FAMILY} {TABLE} translate ip daddr . meta l4proto . th dport vmap @services",
        f"add chain {FAMILY} {TABLE} refuse"
        f" {{ type filter hook output priority {FILTER_PRIORITY}; policy accept; }}",
        f"add rule {FAMILY} {TABLE} refuse ip daddr . meta l4proto . th dport @unreachable reject",
    ]
    for key, service in sorted(services.items()):
        lines += _added(key, service)
    return "\n".join(lines) + "\n"


def changed(key: str, before: PodService | None, after: PodService | None) -> str:
    """One Service's change, as one transaction's text (empty: nothing to do)."""
    if before == after:
        return ""
    lines = _removed(key, before) if before is not None else []
    if after is not None:
        lines += _added(key, after)
    return "\n".join(lines) + "\n"


def _added(key: str, service: PodService) -> list[str]:
    lines = []
    for port in service.ports:
        if not port.backends:
            lines.append(f"add element {FAMILY} {TABLE} unreachable {{ {port.element} }}")
            continue
        chain = chain_name(key, port)
        lines.append(f"add chain {FAMILY} {TABLE} {chain}")
        lines.append(f"add rule {FAMILY} {TABLE} {chain} {_pick(port, service.affinity)}")
        lines.append(f"add element {FAMILY} {TABLE} services {{ {port.element} : goto {chain} }}")
    return lines


def _removed(key: str, service: PodService) -> list[str]:
    lines = []
    for port in service.ports:
        if not port.backends:
            lines.append(f"delete element {FAMILY} {TABLE} unreachable {{ {port.element} }}")
            continue
        lines.append(f"delete element {FAMILY} {TABLE} services {{ {port.element} }}")
        lines.append(f"delete chain {FAMILY} {TABLE} {chain_name(key, port)}")
    return lines


def _pick(port: PodPort, affinity: bool) -> str:
    """The rule of one Service port's chain: the backend by a draw, or by the client."""
    choices = ", ".join(f"{i} : {addr} . {num}" for i, (addr, num) in enumerate(port.backends))
    count = len(port.backends)
    draw = f"jhash ip saddr mod {count}" if affinity else f"numgen random mod {count}"
    return f"meta l4proto {port.protocol} dnat ip to {draw} map {{ {choices} }}"
