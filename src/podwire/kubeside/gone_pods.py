"""The Kubernetes API as the truth for cleanup: an in-use port whose pod the API no longer
has is released through the path its agent's DEL takes (a pod deleted while its node's agent
was down, or while no controller led), and deleted rather than pooled: no agent unplugged it.
A pod leaves the API before kubelet tears its sandbox down, so a port is judged only once its
pod has been gone for ``grace`` seconds: a DEL within that time gives it back to its pool
(judged at once, every pod deleted through kubelet cost its pool a port and a refill).

Only records that name a pod by uid are judged, only once this term's pod informer has
listed (a pod absent from a cache that has not listed is not gone), and a pod the cache does
not hold (or holds under another uid) is asked of the API before its port is released: a
pod whose ADD reached the controller before its watch event did is not taken for gone. An
API that does not answer releases nothing; the pass is tried again after a backoff."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from podwire.backoff import Backoff, passes_on_wake
from podwire.errors import PodwireError
from podwire.k8s.objects import K8sPod, ObjectKey
from podwire.kubeside.pools import TermPorts
from podwire.log import get_logger
from podwire.schema.vif import PodRef

log = get_logger(__name__)

# The API's answer for one pod: its raw object, None when it has no such pod.
GetPod = Callable[[str, str], Awaitable[Any | None]]
Release = Callable[[str, str, bool], Awaitable[None]]


class GonePods:
    def __init__(self, service: TermPorts, release: Release, get_pod: GetPod, grace: float) -> None:
        """``release``: the VIF API's release (``VifBroker.release``), the agent's DEL path,
        asked not to pool the port again: the node may still have it plugged (its agent is
        down, or did not unplug it), so it is deleted, never handed to another pod."""
        self._service = service
        self._release = release
        self._get_pod = get_pod
        self._grace = grace
        self._backoff = Backoff(1.0, 30.0)
        # (node, attachment, pod uid) -> when its pod was first found gone (monotonic).
        self._gone_since: dict[tuple[str, str, str], float] = {}

    async def run(self, pods: Mapping[ObjectKey, K8sPod], changed: asyncio.Event) -> None:
        """After the pod informer's first list, for one term: a pass at once (ports of pods
        deleted while no controller led), then one after every pod event."""

        async def one_pass() -> float | None:
            await self.release_gone(pods)
            return self._next_due()

        def retry(exc: PodwireError, delay: float) -> None:  # the API or etcd away: later
            log.warning("controller.gone_pods.retry", error=str(exc), delay=delay)

        await passes_on_wake(one_pass, changed, self._backoff, retry)

    def _next_due(self) -> float | None:
        """Seconds until the first pod found gone has been gone ``grace`` long; None: none."""
        if not self._gone_since:
            return None
        due = min(self._gone_since.values()) + self._grace - time.monotonic()
        return max(due, 0.05)

    async def release_gone(self, pods: Mapping[ObjectKey, K8sPod]) -> list[str]:
        """Release the attachments whose pod has been gone ``grace`` long; returns their
        ports."""
        released = []
        now, waiting = time.monotonic(), {}
        for (node, attachment), record in list(self._service.attachments.items()):
            pod = record.pod
            if pod is None or not pod.uid or _cached(pods, pod):
                continue
            if await self._exists(pod):
                continue
            since = self._gone_since.get((node, attachment, pod.uid), now)
            if now - since < self._grace:
                waiting[(node, attachment, pod.uid)] = since
                continue
            log.warning(
                "controller.pod_gone",
                node=node,
                attachment=attachment,
                pod=f"{pod.namespace}/{pod.name}",
                uid=pod.uid,
                port=record.vif.port_id,
            )
            await self._release(node, attachment, False)
            released.append(record.vif.port_id)
        self._gone_since = waiting  # a DEL meanwhile took the attachment out: forgotten
        return released

    async def _exists(self, pod: PodRef) -> bool:
        raw = await self._get_pod(pod.namespace, pod.name)
        if raw is None:
            return False
        metadata = raw.get("metadata") if isinstance(raw, dict) else None
        return not isinstance(metadata, dict) or metadata.get("uid") == pod.uid


def _cached(pods: Mapping[ObjectKey, K8sPod], pod: PodRef) -> bool:
    found = pods.get(ObjectKey(pod.namespace, pod.name))
    return found is not None and found.meta.uid == pod.uid
