"""Each pod on a podwire network shows its port in its annotations (``k8s/port_annotations``):
the leader is their one writer, with one merge patch per pod whose values changed, naming
only those keys (the pod's other annotations are never touched) and the pod's uid (a pod
made again under the same name is refused by the apiserver, not annotated with the old
one's port).

Where a pod's port is known, in this order:

- the controller's in-use records (``/podwire/vifs/...``), which keep the pod (namespace,
  name, uid) their request named: every port an agent got through the VIF API, pooled or
  made for it, with no Neutron call;
- otherwise, for a pod that has an address and shows no port yet, Neutron's ports of
  podwire's device owner whose ``device_id`` is the pod's uid, asked once per pod: the ports
  agents with ``vif_source = "neutron"`` make themselves, which no record holds. One list
  call per such pod, once, instead of a listing of every port per pass.

A pod that has no port podwire knows of is left alone, and so are the annotations of a port
that went away (the pod goes with it, or its next port replaces them)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from podwire.backoff import Backoff, passes_on_wake
from podwire.errors import PodwireError
from podwire.k8s.objects import K8sPod, ObjectKey
from podwire.k8s.port_annotations import PORT_ID, ShownPort, port_annotations
from podwire.kubeside.pools import TermPorts
from podwire.log import get_logger
from podwire.neutron.client import PortSummary
from podwire.schema.inuse import InUse

log = get_logger(__name__)

# A merge patch of one pod; False when the API has no such pod (any more) under that uid.
PatchPod = Callable[[str, str, dict[str, Any]], Awaitable[bool]]
# The ports of podwire's device owner whose device_id is the given pod uid.
PortsOfDevice = Callable[[str], Awaitable[list[PortSummary]]]


class PodAnnotator:
    def __init__(
        self, service: TermPorts, patch: PatchPod, ports_of: PortsOfDevice | None = None
    ) -> None:
        self._service = service
        self._patch = patch
        self._ports_of = ports_of
        self._backoff = Backoff(1.0, 30.0)
        # What was patched, by pod uid: its watch event may come after the next pass.
        self._written: dict[str, dict[str, str]] = {}
        self._asked: dict[str, list[ShownPort]] = {}  # Neutron's answers, by pod uid

    async def run(self, pods: Mapping[ObjectKey, K8sPod], changed: asyncio.Event) -> None:
        """After the pod informer's first list, for one term: a pass at once, then one after
        every pod event or change of the in-use records (``changed``)."""
        self._service.attachment_listeners.append(changed.set)

        async def one_pass() -> None:
            await self.annotate(pods)  # the API away: the next pass patches what changed

        def retry(exc: PodwireError, delay: float) -> None:
            log.warning("controller.pod_annotations.retry", error=str(exc), delay=delay)

        try:
            await passes_on_wake(one_pass, changed, self._backoff, retry)
        finally:
            self._service.attachment_listeners.remove(changed.set)

    async def annotate(self, pods: Mapping[ObjectKey, K8sPod]) -> int:
        """One pass; returns how many pods were patched."""
        recorded = _recorded(self._service.attachments.values())
        patched = 0
        current = list(pods.values())
        uids = {pod.meta.uid for pod in current}
        self._written = {uid: v for uid, v in self._written.items() if uid in uids}
        self._asked = {uid: v for uid, v in self._asked.items() if uid in uids}
        for pod in current:
            ports = recorded.get(pod.meta.uid) or await self._asked_of(pod)
            if not ports:
                continue
            wanted = port_annotations(ports)
            if self._written.get(pod.meta.uid) == wanted or _shows(pod, wanted):
                continue
            key = pod.meta.key
            body = {"metadata": {"uid": pod.meta.uid, "annotations": wanted}}
            if await self._patch(key.namespace, key.name, body):
                self._written[pod.meta.uid] = wanted
                patched += 1
                log.info("controller.pod_annotated", pod=str(key), port=wanted[PORT_ID])
        return patched

    async def _asked_of(self, pod: K8sPod) -> list[ShownPort]:
        """Neutron's ports of the pod, asked once, only for a pod with an address of its
        own that shows no port yet."""
        if self._ports_of is None or not pod.has_own_address or PORT_ID in pod.shown:
            return []
        uid = pod.meta.uid
        if uid not in self._asked:
            found = await self._ports_of(uid)
            self._asked[uid] = [_from_summary(port) for port in found]
        return self._asked[uid]


def _shows(pod: K8sPod, wanted: dict[str, str]) -> bool:
    return all(pod.shown.get(key) == value for key, value in wanted.items())


def _recorded(records: Iterable[InUse]) -> dict[str, list[ShownPort]]:
    found: dict[str, list[ShownPort]] = {}
    for record in records:
        if record.pod is None or not record.pod.uid:
            continue
        vif = record.vif
        shown = ShownPort(
            port_id=vif.port_id,
            mac=vif.mac_address,
            addresses=tuple(ip.ip_address for ip in vif.fixed_ips),
            network_id=vif.network_id,
            interface=record.attachment.rpartition(":")[2],
        )
        found.setdefault(record.pod.uid, []).append(shown)
    return found


def _from_summary(port: PortSummary) -> ShownPort:
    return ShownPort(
        port_id=port.id,
        mac=port.mac_address,
        addresses=tuple(str(ip.get("ip_address")) for ip in port.fixed_ips),
        network_id=port.network_id,
    )
