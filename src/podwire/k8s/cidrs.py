"""An ipBlock's ``except``s expanded into the complementary CIDRs: Neutron rules can only
allow prefixes, so ``10.0.0.0/8 except 10.1.0.0/16`` becomes the prefixes that cover the
rest of 10.0.0.0/8 exactly (at most 32 or 128 per except)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def allowed_prefixes(cidr: IpNetwork, excepts: Iterable[IpNetwork]) -> tuple[IpNetwork, ...]:
    """The fewest prefixes covering ``cidr`` minus every except, in address order."""
    remaining: list[IpNetwork] = [cidr]
    for hole in excepts:
        remaining = [piece for part in remaining for piece in _without(part, hole)]
    collapsed = ipaddress.collapse_addresses(remaining)  # type: ignore[type-var]
    return tuple(sorted(collapsed, key=lambda net: (net.network_address, net.prefixlen)))


def _without(part: IpNetwork, hole: IpNetwork) -> list[IpNetwork]:
    if part.version != hole.version or not part.overlaps(hole):  # type: ignore[arg-type]
        return [part]
    if _covers(hole, part):
        return []
    return list(part.address_exclude(hole))  # type: ignore[arg-type]


def _covers(outer: IpNetwork, inner: IpNetwork) -> bool:
    low = int(outer.network_address) <= int(inner.network_address)
    return low and int(inner.broadcast_address) <= int(outer.broadcast_address)
