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
from podwire.errors import KubeApiError, PodwireError, ValidationError
from podwire.k8s.api import KubeApi
from podwire.k8s.cache import Cache
from podwire.k8s.compile import pod_policies
from podwire.k8s.events import EventRecorder, ObjectRef
from podwire.k8s.informer import WATCH_SECONDS, Informer
from podwire.k8s.nodes import read_node
from podwire.k8s.objects import K8sPod, ObjectKey, read_pod
from podwire.k8s.reach import ApiReach
from podwire.k8s.watcher import KubeWatcher
from podwire.kubeside.errors import PolicyNotReady
from podwire.kubeside.gone_nodes import GoneNodes
from podwire.kubeside.gone_pods import GonePods
from podwire.kubeside.metrics import KubeMetrics
from podwire.kubeside.netpol_sync import NetpolReconciler, PortSide
from podwire.kubeside.ns_networks import NamespaceNetworks
from podwire.kubeside.pod_annotations import PodAnnotator
from podwire.kubeside.refusals import port_refused
from podwire.kubeside.service_publish import ServicePublisher
from podwire.log import get_logger
from podwire.neutron.netpol import NetpolObjects
from podwire.schema.vif import PodRef

log = get_logger(__name__)

# Seconds a pod's request waits for what its groups need (this term's first lists, its
# policies' groups in Neutron) before it is refused as retryable: kubelet asks again.
POD_GROUPS_WAIT = 10.0


class KubernetesSide:
    def __init__(
        self,
        api: KubeApi,
        objects: NetpolObjects,
        fence: Callable[[str], None],
        metrics: KubeMetrics,
        project_id: str,
        watch_seconds: int = WATCH_SECONDS,
        ports: PortSide | None = None,
        gone: GonePods | None = None,
        namespaces: NamespaceNetworks | None = None,
        nodes: GoneNodes | None = None,
        annotator: PodAnnotator | None = None,
        services: ServicePublisher | None = None,
    ) -> None:
        """``project_id``: where the groups are made, so the one project whose pods get them.
        ``ports``: what moves the in-use and pooled ports after each pass; ``gone``: what
        releases the ports of pods the API no longer has; ``nodes``: what releases the
        ports of a Node deleted from the API; ``annotator``: what shows pods their ports;
        ``services``: what publishes the Services for the agents."""
        self.api = api
        self.project_id = project_id
        self._objects = objects
        self._fence = fence
        self._metrics = metrics
        self._watch_seconds = watch_seconds
        self._ports = ports
        self._gone = gone
        self._nodes = nodes
        self._annotator = annotator
        self._services = services
        self.namespaces = namespaces
        if namespaces is not None:
            namespaces.api_problem = lambda: self.reach.problem
        self.reach = ApiReach(api.server, on_error=metrics.api_errors.inc)
        # Kept across terms and restarts of this side: a failure's count is not forgotten.
        self.events = EventRecorder(api)
        if namespaces is not None:
            namespaces.on_problem = lambda name, uid, message: self.events.warn(
                ObjectRef.of_namespace(name, uid), "NetworkRefused", message
            )
        metrics.api_up.set_function(lambda: 0.0 if self.reach.away else 1.0)
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
            watcher.cluster,
            self._objects,
            fence=self._fence,
            metrics=self._metrics,
            ports=self._ports,
        )
        reconciler.on_refused = self._policies_refused
        reconciler.on_not_enforced = self._policy_not_enforced
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(watcher.run(), name="k8s-watcher")
            tasks.create_task(self.events.run(), name="k8s-events")
            if self._nodes is not None:
                nodes = Informer(
                    self.api,
                    Cache("nodes", self._nodes.on_event),
                    read_node,
                    watch_seconds=self._watch_seconds,
                    reach=self.reach,
                )
                tasks.create_task(nodes.run(), name="k8s-informer-nodes")
                tasks.create_task(self._nodes.run(), name="gone-nodes")
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
            if self._gone is not None:
                pods = watcher.pods.objects
                tasks.create_task(self._gone.run(pods, watcher.pods_changed), name="gone-pods")
            if self._annotator is not None:
                shown = self._annotator.run(watcher.pods.objects, watcher.pods_shown)
                tasks.create_task(shown, name="pod-annotations")
            if self.namespaces is not None:
                tasks.create_task(self.namespaces.run(watcher), name="namespace-networks")
            if self._services is not None:
                tasks.create_task(self._services.run(watcher), name="services")

    async def pod_network(self, pod: PodRef) -> str | None:
        """The network of the pod's namespace (``ns_networks``), None for the request's."""
        if self.namespaces is None:
            return None
        return await self.namespaces.network_for(pod)

    def pod_failed(self, pod: PodRef, exc: PodwireError) -> None:
        """A pod's request that failed for a cause no retry of it removes is named on the
        pod (kubelet's own Events say only that the CNI ADD failed)."""
        if port_refused(exc):
            ref = ObjectRef.pod(pod.namespace, pod.name, pod.uid)
            self.events.warn(ref, "FailedNeutronPort", f"no Neutron port for this pod: {exc}")

    def _policies_refused(self, policies: list[ObjectKey], reason: str) -> None:
        for key in policies:
            self._policy_not_enforced(
                key,
                f"Neutron refused this policy's security group or rules: {reason}; the pass"
                " is retried with backoff",
            )

    def _policy_not_enforced(self, key: ObjectKey, message: str) -> None:
        cached = self.watcher.policies.objects if self.watcher is not None else {}
        found = cached.get(key)
        uid = found.meta.uid if found is not None else ""
        ref = ObjectRef.network_policy(key.namespace, key.name, uid)
        self.events.warn(ref, "PolicyNotEnforced", message)

    async def pod_groups(self, pod: PodRef, project_id: str) -> tuple[str, ...]:
        """The Neutron ids of the groups a pod's port must carry (its policies', and the open
        group of each direction none selects it in), decided before its port is handed out
        so that it is isolated from its first packet. Waits up to ``POD_GROUPS_WAIT`` for what
        it lacks (this term's first lists, a new policy's group), then refuses as retryable
        rather than hand out a port its policies would not allow. Ports of other projects
        carry no policy group (a port takes only groups of its own project)."""
        if project_id != self.project_id:
            return ()
        lacking = [f"the Kubernetes API at {self.api.server} has not been read yet"]
        try:
            async with asyncio.timeout(POD_GROUPS_WAIT):
                while not self.synced or self.watcher is None or self.reconciler is None:
                    if self.reach.problem is not None:
                        lacking[0] = f"the Kubernetes API is not answering: {self.reach.problem}"
                    await asyncio.sleep(0.05)
                watcher, reconciler = self.watcher, self.reconciler
                found = await self._pod(watcher, pod)
                names = pod_policies(watcher.policies.objects.values(), found).groups
                while missing := names - reconciler.group_ids.keys():
                    cause = f"; the last pass: {reconciler.problem}" if reconciler.problem else ""
                    lacking[0] = f"groups {sorted(missing)} are not in Neutron yet{cause}"
                    await reconciler.next_pass()
                return tuple(sorted(reconciler.group_ids[name] for name in names))
        except TimeoutError as exc:
            raise PolicyNotReady(
                f"NetworkPolicy groups of pod {pod.namespace}/{pod.name} not decided after"
                f" {POD_GROUPS_WAIT:.0f} s: {lacking[0]}; retry"
            ) from exc

    async def _pod(self, watcher: KubeWatcher, ref: PodRef) -> K8sPod:
        """The cached pod, or the API's when the cache does not hold it (yet) or holds an
        earlier pod of the same name."""
        cached = watcher.pods.objects.get(ObjectKey(ref.namespace, ref.name))
        if cached is not None and (not ref.uid or cached.meta.uid == ref.uid):
            return cached
        what = f"pod {ref.namespace}/{ref.name}"
        try:
            raw = await self.api.pod(ref.namespace, ref.name)
            found = None if raw is None else read_pod(raw)
        except (KubeApiError, ValidationError) as exc:
            raise PolicyNotReady(f"NetworkPolicy groups of {what}: {exc}; retry") from exc
        if found is None or (ref.uid and found.meta.uid != ref.uid):
            raise PolicyNotReady(
                f"NetworkPolicy groups of {what}: the Kubernetes API has no such pod"
                + (f" with uid {ref.uid}" if ref.uid else "")
                + "; retry"
            )
        return found
