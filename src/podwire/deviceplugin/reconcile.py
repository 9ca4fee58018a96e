"""Deciding which checkpointed grants are still live, from kubelet's view of running pods.

Kubelet is the authority on which device belongs to which running pod; our checkpoint only
knows what we handed out. A grant none of whose devices is assigned any more belongs to a pod
that is gone. A grace period protects grants kubelet has not yet recorded (Allocate answers
before kubelet stores the assignment and before the pod shows up in List).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from podwire.deviceplugin.model import ALLOCATION_ID_RE, Allocation, PodName


@dataclass(frozen=True)
class ReconcilePlan:
    bind: dict[str, PodName] = field(default_factory=dict)
    release: tuple[str, ...] = ()
    kept_young: int = 0


def plan(
    allocations: Iterable[Allocation],
    assigned: Mapping[str, PodName],
    *,
    now: float,
    grace: float,
    busy: Collection[str] = (),
) -> ReconcilePlan:
    bind: dict[str, PodName] = {}
    release: list[str] = []
    young = 0
    for allocation in allocations:
        if allocation.id in busy:
            continue
        pods = {assigned[d] for d in allocation.devices if d in assigned}
        if pods:
            # A container's devices all belong to one pod; min() keeps the choice stable if
            # kubelet ever reports otherwise.
            pod = min(pods)
            if allocation.pod != pod:
                bind[allocation.id] = pod
        elif now - allocation.created_at < grace:
            young += 1
        else:
            release.append(allocation.id)
    return ReconcilePlan(bind, tuple(release), young)


def unknown_dirs(memif_host_dir: str, known_ids: Collection[str]) -> list[Path]:
    """Dirs that look like ours but are in no grant: reported, never deleted automatically.

    Grants are checkpointed before their dir is made and the dir is removed before the grant
    is dropped, so a crash can never leave one of these; they come from a lost checkpoint
    (the pods using them may still run) or from someone else.
    """
    try:
        names = os.listdir(memif_host_dir)
    except OSError:
        return []
    return sorted(
        Path(memif_host_dir) / name
        for name in names
        if ALLOCATION_ID_RE.fullmatch(name) and name not in known_ids
    )
