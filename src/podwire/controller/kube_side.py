"""The Kubernetes side of a leader term: informers over the API and the NetworkPolicy
reconciler, started by the term and gone with it.

It runs beside the pools, never in their way: an apiserver that is down or unreachable (at
start or later) leaves the informers retrying with backoff (one ``k8s.api.away`` line naming
the server and the error, ``k8s.api.back`` when it answers again) while the term serves
ports as before. A failure nobody foresaw restarts this side alone (``backoff.Supervised``);
only a configuration error ends the term. Each term lists afresh: the reconciler's first
pass compares what the API says now with Neutron, so events missed between terms or while
no controller led do not matter."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from podwire.backoff import Supervised
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.netpol_sync import NetpolReconciler
from podwire.k8s.api import KubeApi
from podwire.k8s.informer import WATCH_SECONDS
from podwire.k8s.reach import ApiReach
from podwire.k8s.watcher import KubeWatcher
from podwire.log import get_logger
from podwire.neutron.netpol import NetpolObjects

log = get_logger(__name__)


class KubernetesSide:
    def __init__(
        self,
        api: KubeApi,
        objects: NetpolObjects,
        fence: Callable[[str], None],
        metrics: ControllerMetrics,
        watch_seconds: int = WATCH_SECONDS,
    ) -> None:
        self.api = api
        self._objects = objects
        self._fence = fence
        self._metrics = metrics
        self._watch_seconds = watch_seconds
        self.reach = ApiReach(api.server, on_error=metrics.kubernetes_errors.inc)
        metrics.kubernetes_up.set_function(lambda: 0.0 if self.reach.away else 1.0)
        self.supervised = Supervised("kubernetes", self._run)
        self.watcher: KubeWatcher | None = None  # the current term's
        self.reconciler: NetpolReconciler | None = None
        self.synced = False  # this term's informers have all listed once

    async def run(self) -> None:
        """For one term (the term's task group cancels it when the term ends)."""
        self.synced = False
        try:
            await self.supervised.run()
        finally:
            self.synced = False

    def problem(self) -> str | None:
        """What readiness says of this side: the apiserver's failure, a failing reconciler,
        a restarted side, or the first lists still under way; None while it is in step."""
        if self.reach.problem is not None:
            return self.reach.problem
        if self.supervised.health.problem is not None:
            return self.supervised.health.problem
        if self.reconciler is not None and self.reconciler.problem is not None:
            return f"NetworkPolicy sync: {self.reconciler.problem}"
        if not self.synced:
            return f"{self.api.server}: listing"
        return None

    async def _run(self) -> None:
        watcher = self.watcher = KubeWatcher(self.api, self._watch_seconds, self.reach)
        reconciler = self.reconciler = NetpolReconciler(
            watcher.cluster, self._objects, fence=self._fence, metrics=self._metrics
        )
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(watcher.run(), name="k8s-watcher")
            # Compiled before every kind is listed, the policies of a kind not yet read would
            # look deleted: the reconciler starts on the whole picture, with one pass even if
            # the cluster is empty (policies deleted while no controller led).
            await watcher.synced()
            self.synced = True
            log.info(
                "controller.kubernetes.synced",
                server=self.api.server,
                namespaces=len(watcher.namespaces.objects),
                pods=len(watcher.pods.objects),
                policies=len(watcher.policies.objects),
            )
            watcher.changed.set()
            tasks.create_task(reconciler.run(watcher.changed), name="netpol-reconciler")
