"""The informers the controller's compilers read (Namespaces, Pods, NetworkPolicies for the
policies; Services, EndpointSlices and Pods for the Services), run together, with a wake-up
per consumer: events are many, and a reconciler wants to know only that something it reads
changed since it last compiled."""

from __future__ import annotations

import asyncio
from typing import Any

from podwire.k8s.api import KubeApi
from podwire.k8s.cache import Cache, Event
from podwire.k8s.compile import Cluster
from podwire.k8s.informer import WATCH_SECONDS, Informer
from podwire.k8s.netpol import NetworkPolicy, read_policy_or_closed
from podwire.k8s.objects import K8sNamespace, K8sPod, read_namespace, read_pod
from podwire.k8s.reach import ApiReach
from podwire.k8s.services import EndpointSlice, K8sService, read_endpoint_slice, read_service


class KubeWatcher:
    def __init__(
        self, api: KubeApi, watch_seconds: int = WATCH_SECONDS, reach: ApiReach | None = None
    ) -> None:
        self.changed = asyncio.Event()
        self.pods_changed = asyncio.Event()  # a pod came, changed or went
        self.pods_shown = asyncio.Event()  # the same, for the pod annotations' writer
        # A namespace or a pod came, changed or went (a namespace deleted waits for its pods).
        self.namespaces_changed = asyncio.Event()
        self.services_changed = asyncio.Event()  # a Service, an EndpointSlice or a pod
        self.reach = reach or ApiReach(api.server)
        self.namespaces: Cache[K8sNamespace] = Cache("namespaces", self._on_event)
        self.pods: Cache[K8sPod] = Cache("pods", self._on_event)
        self.policies: Cache[NetworkPolicy] = Cache("networkpolicies", self._on_event)
        self.services: Cache[K8sService] = Cache("services", self._on_event)
        self.slices: Cache[EndpointSlice] = Cache("endpointslices", self._on_event)
        readers: list[tuple[Cache[Any], Any]] = [
            (self.namespaces, read_namespace),
            (self.pods, read_pod),
            (self.policies, read_policy_or_closed),
            (self.services, read_service),
            (self.slices, read_endpoint_slice),
        ]
        self.informers: tuple[Informer[Any], ...] = tuple(
            Informer(api, cache, read, watch_seconds=watch_seconds, reach=self.reach)
            for cache, read in readers
        )

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            for informer in self.informers:
                tasks.create_task(informer.run(), name=f"k8s-informer-{informer.kind}")

    async def synced(self) -> None:
        """Until every informer has listed once: compiled before that, a missing kind reads
        as "no policies" or "no pods", and a reconciler would delete what is still wanted."""
        for informer in self.informers:
            await informer.listed.wait()

    def cluster(self) -> Cluster:
        """A snapshot: the compiler never sees a cache change under it."""
        return Cluster(
            namespaces=dict(self.namespaces.objects),
            pods=dict(self.pods.objects),
            policies=dict(self.policies.objects),
        )

    def _on_event(self, event: Event[Any]) -> None:
        if event.kind in (self.namespaces.kind, self.pods.kind, self.policies.kind):
            self.changed.set()
        if event.kind == self.pods.kind:
            self.pods_changed.set()
            self.pods_shown.set()
        if event.kind in (self.pods.kind, self.namespaces.kind):
            self.namespaces_changed.set()
        if event.kind in (self.pods.kind, self.services.kind, self.slices.kind):
            self.services_changed.set()
