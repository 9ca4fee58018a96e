"""What a pod's own network namespace holds to reach ClusterIP Services: one nftables table,
``ip podwire_services``, translating a connection's first packet to one ready backend.

The translation happens in the client pod, before its packet reaches its port: the packet
leaves with the backend's address, so the client's security groups (egress) and the
backend's (ingress) judge the connection the Service carries exactly as they judge a direct
one, the reply comes back to the client whichever node the backend is on, and the client's
conntrack turns it back into the ClusterIP's. A pod gets only the backends on its own
network (and those outside every network): on overlapping tenant networks an address means
a different pod on each.

Layout, all of it sets and maps but for a few fixed chains, so a change of one Service is a
change of its own elements (no chain is rewritten, and libnftables never loads the others):
``services`` maps (ClusterIP, protocol, port) to the chain that picks among that many
backends (``pick_N``: ``numgen random mod N``; ``stick_N``: ``jhash`` of the client address,
for ClientIP affinity: a pod is one client, so it keeps its backend while the set stays);
that chain looks up (ClusterIP, protocol, port, draw) in ``backends``. A Service port without
backends for this pod is in the set ``unreachable`` and its packets are rejected where they
are made, so the client learns at once instead of after a timeout (a TCP connect is
refused, a UDP send fails "Operation not permitted"), as kube-proxy refuses such a
Service."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from podwire.schema.services import HOST_NETWORK, ServiceEntry

TABLE = "podwire_services"
FAMILY = "ip"
NAT_PRIORITY = -100  # dstnat: before routing picks the way out
FILTER_PRIORITY = 0
KEY = "ip daddr . meta l4proto . th dport"  # what a Service is looked up by
# Picking chains every table has from the start: a Service scaled within these never needs
# the table written whole (``changed``).
MADE_AHEAD = {f"pick_{count}" for count in range(1, 17)}


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


def chains(services: Mapping[str, PodService]) -> set[str]:
    """The picking chains ``services`` need."""
    return {
        _chain(port, svc.affinity)
        for svc in services.values()
        for port in svc.ports
        if port.backends
    }


def whole(services: Mapping[str, PodService]) -> str:
    """The table from scratch, replacing whatever a table of that name held."""
    where = f"{FAMILY} {TABLE}"
    lines = [
        f"add table {where}",
        f"delete table {where}",
        f"add table {where}",
        f"add map {where} backends {{ typeof {KEY} . numgen random mod 2 : ip daddr . th dport; }}",
        f"add map {where} services {{ type ipv4_addr . inet_proto . inet_service : verdict; }}",
        f"add set {where} unreachable {{ type ipv4_addr . inet_proto . inet_service; }}",
        f"add chain {where} translate"
        f" {{ type nat hook output priority {NAT_PRIORITY}; policy accept; }}",
        f"add rule {where} translate {KEY} vmap @services",
        f"add chain {where} refuse"
        f" {{ type filter hook output priority {FILTER_PRIORITY}; policy accept; }}",
        f"add rule {where} refuse {KEY} @unreachable reject",
    ]
    lines += _new_chains(chains(services) | MADE_AHEAD, set())
    for service in services.values():
        lines += _elements("add", service)
    return "\n".join(lines) + "\n"


def changed(before: PodService | None, after: PodService | None, present: set[str]) -> str | None:
    """One Service's change, as one transaction's text (empty: nothing to do); None when it
    needs a picking chain the table lacks (``present``): then the table is written whole.
    A chain added to the table later would have to read the ``backends`` map's declaration
    back from the kernel, which libnftables 1.0.6 cannot ("conflicting protocols specified:
    ip vs. th"), so chains are only ever made with the table."""
    if before == after:
        return ""
    if after is not None and not chains({"": after}) <= present:
        return None
    lines = []
    if before is not None:
        lines += _elements("delete", before)
    if after is not None:
        lines += _elements("add", after)
    return "\n".join(lines) + "\n"


def _new_chains(wanted: set[str], present: set[str]) -> list[str]:
    lines = []
    for chain in sorted(wanted - present):
        kind, _, count = chain.partition("_")
        draw = "jhash ip saddr" if kind == "stick" else "numgen random"
        lines.append(f"add chain {FAMILY} {TABLE} {chain}")
        lines.append(
            f"add rule {FAMILY} {TABLE} {chain} dnat ip to {KEY} . {draw} mod {count} map @backends"
        )
    return lines


def _chain(port: PodPort, affinity: bool) -> str:
    return f"{'stick' if affinity else 'pick'}_{len(port.backends)}"


def _elements(verb: str, service: PodService) -> list[str]:
    where = f"{FAMILY} {TABLE}"
    lines = []
    for port in service.ports:
        if not port.backends:
            lines.append(f"{verb} element {where} unreachable {{ {port.element} }}")
            continue
        target = f" : jump {_chain(port, service.affinity)}" if verb == "add" else ""
        lines.append(f"{verb} element {where} services {{ {port.element}{target} }}")
        draws = [
            f"{port.element} . {i}" + (f" : {addr} . {num}" if verb == "add" else "")
            for i, (addr, num) in enumerate(port.backends)
        ]
        lines.append(f"{verb} element {where} backends {{ {', '.join(draws)} }}")
    return lines
