"""What the node's memif master has been told of each port's classifier, and what it
confirmed (#38): the bookkeeping between the policy enforcer's compiled classifiers and the
master's control socket, apart from the memif ports' lifecycle (``memif.MemifService``).

A compiled classifier is never replaced by the master's answer: a refusal is kept beside it
(the port's frames then go through the kernel), so the next compilation, or a restarted
master, is tried again with what the enforcer compiled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import Enum

from podwire.log import get_logger
from podwire.memif import master as memif_master
from podwire.sgpolicy.classifier import UNFILTERED, encode

log = get_logger(__name__)

UNFILTERED_BLOB = encode(UNFILTERED)
NOT_SERVED = "no port of this name"  # the master's words for a port it does not serve (yet)


@dataclass(frozen=True)
class MasterClassifier:
    """A port's classifier as the enforcer compiled it (``blob``), or None and why not."""

    blob: bytes | None
    why: str


class Pushed(Enum):
    CONFIRMED = "confirmed"  # the master filters the port as compiled
    UNUSABLE = "unusable"  # over a limit, or refused: the port's frames go through the kernel
    LATER = "later"  # the master does not serve the port (yet) or does not answer


class PortClassifiers:
    def __init__(self, control: memif_master.MasterControl) -> None:
        self._control = control
        self.compiled: dict[str, MasterClassifier] = {}  # by tap
        self._confirmed: dict[str, bytes] = {}  # by tap: what this master confirmed
        self._refused: dict[str, tuple[bytes, str]] = {}  # by tap: blob, the master's reason
        # Held while a classifier goes to the master or a path is set from what it confirmed;
        # never while waiting for the enforcer (whose pass waits for ``push``).
        self.lock = asyncio.Lock()

    def compile_done(self, tap: str, blob: bytes | None, why: str) -> None:
        self.compiled[tap] = MasterClassifier(blob, why)

    def confirmed(self, tap: str) -> bool:
        wanted = self.compiled.get(tap)
        return wanted is not None and wanted.blob is not None and (
            self._confirmed.get(tap) == wanted.blob
        )  # fmt: skip

    def pending(self, tap: str) -> bool:
        """A compiled classifier the master has neither confirmed nor refused."""
        wanted = self.compiled.get(tap)
        if wanted is None or wanted.blob is None or self.confirmed(tap):
            return False
        return self._refused.get(tap, (b"", ""))[0] != wanted.blob

    def filtered_in_master(self, tap: str) -> bool:
        """Whether this master confirmed a classifier that filters (not the unfiltered one)."""
        confirmed = self._confirmed.get(tap)
        return confirmed is not None and confirmed != UNFILTERED_BLOB

    def reason(self, tap: str) -> str:
        wanted = self.compiled.get(tap)
        if wanted is None:
            return "waiting for the enforcer's classifier"
        if wanted.blob is None:
            return wanted.why
        if self.confirmed(tap):
            return "security groups in the master"
        refused = self._refused.get(tap)
        if refused is not None and refused[0] == wanted.blob:
            return f"master refused the classifier: {refused[1]}"
        return "classifier not confirmed by the master yet"

    def forget_confirmed(self, tap: str | None = None) -> None:
        """The master no longer holds what it confirmed: the port (or every port, when it was
        restarted) was added again, unfiltered."""
        if tap is None:
            self._confirmed.clear()
            self._refused.clear()
        else:
            self._confirmed.pop(tap, None)
            self._refused.pop(tap, None)

    def forget(self, tap: str) -> None:
        self.compiled.pop(tap, None)
        self.forget_confirmed(tap)

    async def push(self, tap: str) -> Pushed:
        """The compiled classifier to the master (call under ``lock``)."""
        wanted = self.compiled.get(tap)
        if wanted is None or wanted.blob is None:
            return Pushed.UNUSABLE
        if self.confirmed(tap):
            return Pushed.CONFIRMED
        if not self.pending(tap):
            return Pushed.UNUSABLE  # this very blob was refused already
        try:
            await asyncio.to_thread(self._control.set_policy, tap, wanted.blob)
        except memif_master.MasterRefused as exc:
            if str(exc).endswith(NOT_SERVED):
                return Pushed.LATER  # added again soon, and given its classifier then
            log.error("agent.memif.classifier_refused", tap=tap, error=str(exc),
                      effect="the port's frames go through the kernel")  # fmt: skip
            self._refused[tap] = (wanted.blob, str(exc))
            return Pushed.UNUSABLE
        except memif_master.MasterUnreachable as exc:
            # Supervision restarts a dead master and gives every port its classifier again;
            # failing the enforcer's pass would fail every pod's ADD on the node meanwhile.
            log.warning("agent.memif.classifier_not_sent", tap=tap, error=str(exc))
            self._confirmed.pop(tap, None)
            return Pushed.LATER
        self._confirmed[tap] = wanted.blob
        return Pushed.CONFIRMED
