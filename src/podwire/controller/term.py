"""Which leader term a decision was made in, so no Neutron write outlives the term.

A controller that loses its term may still have work under way: a request handler between
its pool lookup and its port update, a refill between two bulk creates. The next leader may
hand out those same ports meanwhile. Each piece of work remembers the term it started in (a
context variable: tasks started from it inherit it), and every Neutron write first checks that
this term is still the one held; a write decided in an ended term is refused with NotLeader.
"""

from __future__ import annotations

from contextvars import ContextVar

from podwire.errors import NotLeader


class TermGuard:
    def __init__(self) -> None:
        self._held: int | None = None  # the number of the term held now
        self._decided_in: ContextVar[int | None] = ContextVar("podwire_term", default=None)

    @property
    def held(self) -> int | None:
        return self._held

    def begin(self, number: int) -> None:
        """Called in the term's own task: everything it starts is decided in this term."""
        self._held = number
        self._decided_in.set(number)

    def end(self) -> None:
        self._held = None

    def join(self) -> None:
        """Work that starts outside the term (an HTTP request) is decided in the term held
        now; called once the controller has checked that it serves."""
        self._decided_in.set(self._held)

    def check(self, what: str) -> None:
        """NotLeader unless a term is held and the work was decided in it. Work that never
        joined a term (a test or benchmark driving the service directly) is taken as the
        held term's; every path of the controller itself joins one."""
        decided, held = self._decided_in.get(), self._held
        if held is None:
            raise NotLeader(f"{what} refused: this controller holds no leader term (standby)")
        if decided is not None and decided != held:
            raise NotLeader(
                f"{what} refused: decided in leader term {decided}, and the term held now is {held}"
            )
