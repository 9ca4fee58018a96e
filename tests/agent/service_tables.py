"""What the agent's Services follower last wrote into a pod's table, for tests and benches
that wait for a change without listing the kernel's table on every poll."""

from __future__ import annotations

from collections.abc import Mapping

from podwire.agent.services.pods import PodServices
from podwire.agent.services.table import PodService


def holds(follower: PodServices, attachment: str) -> Mapping[str, PodService]:
    """Set once nftables took the pod's transaction; empty while the pod has no table."""
    held = follower._tables.get(attachment)
    return held.services if held is not None else {}
