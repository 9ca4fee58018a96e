"""The agent's record of what the memif master was told of each port's classifier: a refusal
never replaces what the enforcer compiled, a port the master does not serve yet is tried again,
a master that does not answer never fails the enforcer's pass. (The real master is in
tests/agent/test_memif_policy.py and test_memif.py.)"""

from __future__ import annotations

from podwire.agent.ports.memif_classifiers import (
    UNFILTERED_BLOB,
    PortClassifiers,
    Pushed,
)
from podwire.memif.master import MasterRefused, MasterUnreachable

TAP = "pwt0123456789ab"


class Control:
    """The master's control socket as ``push`` sees it: answers from a list, records blobs."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers = list(answers)
        self.sent: list[bytes] = []

    def set_policy(self, name: str, blob: bytes) -> None:
        self.sent.append(blob)
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer


async def test_a_refusal_is_kept_beside_the_compiled_classifier() -> None:
    control = Control(MasterRefused("magic b'PWCX' is not b'PWCL'"))
    found = PortClassifiers(control)  # type: ignore[arg-type]
    found.compile_done(TAP, b"blob-1", "")
    assert await found.push(TAP) == Pushed.UNUSABLE
    assert found.compiled[TAP].blob == b"blob-1" and not found.pending(TAP)
    assert "master refused the classifier: magic" in found.reason(TAP)
    assert await found.push(TAP) == Pushed.UNUSABLE and len(control.sent) == 1  # not again
    found.compile_done(TAP, b"blob-2", "")  # the next compilation is tried
    assert found.pending(TAP) and await found.push(TAP) == Pushed.CONFIRMED
    assert found.confirmed(TAP) and found.filtered_in_master(TAP)


async def test_a_port_not_served_yet_or_a_silent_master_is_tried_again() -> None:
    control = Control(
        MasterRefused("no port of this name"), MasterUnreachable("memif master: timed out")
    )
    found = PortClassifiers(control)  # type: ignore[arg-type]
    found.compile_done(TAP, b"blob", "")
    assert await found.push(TAP) == Pushed.LATER and found.pending(TAP)
    assert await found.push(TAP) == Pushed.LATER and found.pending(TAP)
    assert await found.push(TAP) == Pushed.CONFIRMED and not found.pending(TAP)


async def test_a_master_restarted_is_told_again_and_unfiltered_is_not_filtering() -> None:
    found = PortClassifiers(Control())  # type: ignore[arg-type]
    found.compile_done(TAP, UNFILTERED_BLOB, "")
    assert await found.push(TAP) == Pushed.CONFIRMED and not found.filtered_in_master(TAP)
    found.forget_confirmed()
    assert found.pending(TAP) and not found.confirmed(TAP)
    found.compile_done(TAP, None, "port x: 40 is over the classifier's MAX_MACS = 32")
    assert await found.push(TAP) == Pushed.UNUSABLE and "MAX_MACS" in found.reason(TAP)
    found.forget(TAP)
    assert found.reason(TAP) == "waiting for the enforcer's classifier"
