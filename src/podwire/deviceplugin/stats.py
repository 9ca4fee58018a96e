"""Counters the agent's metrics endpoint exports; plain ints so reading them never blocks."""

from __future__ import annotations

from collections import Counter

COUNTERS = (
    "allocations",
    "allocate_errors",
    "preferred_allocations",
    "releases",
    "registrations",
    "registration_failures",
    "kubelet_restarts",
    "reconciles",
    "reconcile_failures",
    "checkpoint_recoveries",
    "errors",
)


class Stats:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter({name: 0 for name in COUNTERS})

    def inc(self, name: str, amount: int = 1) -> None:
        if name not in COUNTERS:
            raise KeyError(f"unknown counter {name!r}")
        self._counts[name] += amount

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)
