"""What a long-running part tells readiness while it retries: nothing, or the problem it meets.

A part that retries a failure quietly would look healthy to ``/readyz`` while it serves nothing;
each such part owns a ``Health`` and readiness reports the first problem among them.
"""

from __future__ import annotations

from collections.abc import Iterable


class Health:
    def __init__(self, name: str) -> None:
        self.name = name
        self.problem: str | None = None

    def failing(self, problem: str) -> None:
        self.problem = problem

    def ok(self) -> None:
        self.problem = None


def first_problem(parts: Iterable[Health]) -> str | None:
    """``"<name>: <problem>"`` of the first failing part, or None when all are fine."""
    for part in parts:
        if part.problem is not None:
            return f"{part.name}: {part.problem}"
    return None
