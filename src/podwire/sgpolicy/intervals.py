"""Disjoint intervals for nftables interval sets, which refuse overlapping elements.

Security-group rules overlap all the time (``0.0.0.0/0`` port 80 next to ``10.0.0.0/8``
ports 1-1024; two members with one address); nft's concatenated interval sets refuse an
element that overlaps another. Since every rule is an allow, the set to enforce is the union,
so the compiler cuts it into disjoint pieces here: address ranges by a sweep over the rules'
prefixes (each piece carries the rules whose prefix covers it), and per protocol the merged
port ranges.
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")
Span = tuple[int, int]  # inclusive


def merge(spans: Iterable[Span]) -> list[Span]:
    """The union of ``spans`` as sorted, disjoint, non-adjacent spans."""
    out: list[Span] = []
    for low, high in sorted(spans):
        if out and low <= out[-1][1] + 1:
            if high > out[-1][1]:
                out[-1] = (out[-1][0], high)
        else:
            out.append((low, high))
    return out


def prefix_span(cidr: str) -> Span:
    net = ipaddress.ip_network(cidr)
    return int(net.network_address), int(net.broadcast_address)


def sweep(items: list[tuple[Span, T]]) -> list[tuple[Span, list[T]]]:
    """Cut the address line at every span's edges: each piece with the items covering it
    (pieces no item covers are left out; adjacent pieces with equal items are joined).
    One pass over the sorted edges, so a thousand rules cost milliseconds."""
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for index, ((low, high), _) in enumerate(items):
        starts.setdefault(low, []).append(index)
        ends.setdefault(high + 1, []).append(index)
    edges = sorted(starts.keys() | ends.keys())
    active: set[int] = set()
    pieces: list[tuple[Span, frozenset[int]]] = []
    for low, nxt in itertools.pairwise(edges):
        active.difference_update(ends.get(low, ()))
        active.update(starts.get(low, ()))
        if not active:
            continue
        covering = frozenset(active)
        if pieces and pieces[-1][0][1] + 1 == low and pieces[-1][1] == covering:
            pieces[-1] = ((pieces[-1][0][0], nxt - 1), covering)
        else:
            pieces.append(((low, nxt - 1), covering))
    return [(span, [items[i][1] for i in sorted(idx)]) for span, idx in pieces]
