"""Namespaces as networks, in the leader's term: the network a pod's port is taken from, by
its namespace's ``podwire.io/network`` annotation (``k8s.ns_network`` decides), and the
lifecycle of the networks podwire makes for ``auto`` namespaces.

An ``auto`` namespace gets the finalizer before its network is made, so a network never
outlives its namespace unseen: the namespace is deleted only after its pods are gone, their
ports released, and the network, its subnet and router interface deleted. All the state is
in the API (the finalizer) and Neutron (the marked network): a controller restarted in
between finds both and resumes where the last one stopped."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from podwire.backoff import Backoff
from podwire.config import KubernetesSettings, Settings
from podwire.errors import PodwireError, UnknownNetwork
from podwire.k8s.api import KubeApi
from podwire.k8s.ns_network import FINALIZER, Kind, NetworkChoice, network_choice
from podwire.k8s.objects import NETWORK_ANNOTATION, K8sNamespace, ObjectKey
from podwire.k8s.watcher import KubeWatcher
from podwire.kubeside.errors import NamespaceNetworkNotReady
from podwire.kubeside.pools import PoolChanges, TermPorts
from podwire.log import get_logger
from podwire.neutron.ns_networks import NamespaceNetworkObjects
from podwire.schema.vif import PodRef

log = get_logger(__name__)

# Seconds a pod's request waits for its namespace's network (this term's first lists, an
# ``auto`` network still being made) before it is refused as retryable.
NETWORK_WAIT = 10.0
# Seconds between passes while a namespace waits (its pods to go, Neutron to answer).
RETRY = 2.0
MAX_RETRY = 30.0

# Told of a namespace's problem (name, uid, message), beside the log line: an Event.
Problem = Callable[[str, str, str], None]


class NamespaceNetworks:
    def __init__(
        self,
        settings: KubernetesSettings,
        api: KubeApi,
        objects: NamespaceNetworkObjects | None,
        service: TermPorts,
        admin: PoolChanges,
        fence: Callable[[str], None],
        warm_ports: int = 0,
    ) -> None:
        """``objects``: None when ``auto`` is not configured. ``warm_ports``: how many ports
        each live node's pool of a namespace's network is filled with when it appears."""
        self._settings = settings
        self._api = api
        self._objects = objects
        self._service = service
        self._admin = admin
        self._fence = fence
        self._warm_ports = warm_ports
        self.on_problem: Problem | None = None
        # Why the apiserver does not answer, None while it does (said when a pod is refused).
        self.api_problem: Callable[[], str | None] = lambda: None
        self._watcher: KubeWatcher | None = None  # once this term's informers listed
        self._made: dict[ObjectKey, tuple[str, str]] = {}  # namespace -> (uid, network)
        self._warmed: set[str] = set()
        self._holding: set[ObjectKey] = set()  # deleted namespaces whose ports are held
        self._told: dict[ObjectKey, str] = {}  # the problem last reported of a namespace
        self.passed = asyncio.Event()

    @classmethod
    def for_settings(
        cls,
        settings: Settings,
        api: KubeApi,
        conn: Any,
        service: TermPorts,
        admin: PoolChanges,
        fence: Callable[[str], None],
    ) -> NamespaceNetworks:
        """``conn``: the controller's openstacksdk connection."""
        kubernetes = settings.kubernetes
        objects = None
        if kubernetes.auto_networks:
            objects = NamespaceNetworkObjects(
                conn,
                kubernetes.project_id,
                settings.deployment.tag,
                kubernetes.subnet_pool,
                kubernetes.cluster_router,
            )
        return cls(kubernetes, api, objects, service, admin, fence, settings.pool.min)

    async def run(self, watcher: KubeWatcher) -> None:
        """For one term, after the informers listed: a pass at once, then after every
        namespace or pod event, every ``RETRY`` s while a namespace waits for its pods or
        their ports, and with backoff while Neutron or the API fails."""
        self._watcher = watcher
        self._made.clear()
        self._warmed.clear()
        backoff = Backoff(RETRY, MAX_RETRY)
        try:
            while True:
                watcher.namespaces_changed.clear()
                waiting, failing = await self._pass(watcher)
                self.passed.set()
                self.passed.clear()
                delay = backoff.next() if failing else None
                if not failing:
                    backoff.reset()
                if waiting:
                    delay = min(delay or RETRY, RETRY)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await watcher.namespaces_changed.wait()
        finally:
            self._watcher = None

    async def _pass(self, watcher: KubeWatcher) -> tuple[bool, bool]:
        """Whether a namespace waits for its pods or ports, and whether a call failed that
        may succeed later (a bad annotation waits for the namespace to change instead)."""
        waiting = failing = False
        namespaces = list(watcher.namespaces.objects.values())
        for namespace in namespaces:
            try:
                waiting |= await self._one(namespace, watcher)
            except PodwireError as exc:
                self._report(namespace, str(exc))
                failing |= exc.retryable and not isinstance(exc, NamespaceNetworkNotReady)
        present = {n.meta.key for n in namespaces}
        for key in set(self._told) - present:
            del self._told[key]
        return waiting, failing

    async def _one(self, namespace: K8sNamespace, watcher: KubeWatcher) -> bool:
        if namespace.deleting:
            if FINALIZER in namespace.finalizers:
                return await self._tear_down(namespace, watcher)
            return False
        choice = network_choice(namespace, self._settings)
        if choice.kind is Kind.AUTO:
            made = await self._ensure(namespace)
            if made is None:
                return True
            self._warm(made)
        elif choice.kind is Kind.NAMED:
            self._warm(await self._named(namespace, choice))
        self._told.pop(namespace.meta.key, None)
        return False

    async def _named(self, namespace: K8sNamespace, choice: NetworkChoice) -> str:
        try:
            return (await self._service.neutron.network(choice.network_id, None)).id
        except UnknownNetwork as exc:
            raise NamespaceNetworkNotReady(
                f"namespace {namespace.meta.key}: network {choice.network_id} (annotation"
                f" {NETWORK_ANNOTATION}) does not exist in Neutron; retry once it does"
            ) from exc

    async def _ensure(self, namespace: K8sNamespace) -> str | None:
        key, uid = namespace.meta.key, namespace.meta.uid
        made = self._made.get(key)
        if made is not None and made[0] == uid:
            return made[1]
        objects = self._auto_objects()
        if FINALIZER not in namespace.finalizers:
            # First: a network made and then forgotten (a crash, the namespace deleted
            # meanwhile) would have nobody to delete it.
            finalizers = [*namespace.finalizers, FINALIZER]
            if not await self._api.set_namespace_finalizers(
                key.name, finalizers, namespace.meta.resource_version
            ):
                return None  # it changed meanwhile: decided again on what the next pass reads
        self._fence("Neutron: a namespace's network")
        network = await asyncio.to_thread(objects.ensure, key.name, uid)
        self._made[key] = (uid, network.network_id)
        log.info(
            "controller.namespace_network.ready",
            namespace=key.name,
            network=network.network_id,
            subnets=list(network.subnet_ids),
        )
        return network.network_id

    async def _tear_down(self, namespace: K8sNamespace, watcher: KubeWatcher) -> bool:
        """Returns True while the namespace waits for its pods or their ports."""
        key = namespace.meta.key
        pods = [k.name for k in watcher.pods.objects if k.namespace == key.name]
        if pods:
            return True
        objects = self._auto_objects()
        found = await asyncio.to_thread(objects.find, namespace.meta.uid)
        if found is not None:
            held = [
                r.vif.port_id
                for r in self._service.attachments.values()
                if r.key.network_id == found.network_id
            ]
            if held:
                if key not in self._holding:  # once while it waits
                    self._holding.add(key)
                    log.info("controller.namespace_network.ports_held", namespace=key.name,
                             network=found.network_id, ports=held)  # fmt: skip
                return True
            self._holding.discard(key)
            self._fence("Neutron: a namespace's network")
            await self._admin.delete_network_pools(found.network_id)
            await asyncio.to_thread(objects.delete, namespace.meta.uid)
            self._warmed.discard(found.network_id)
            log.info("controller.namespace_network.deleted", namespace=key.name,
                     network=found.network_id)  # fmt: skip
        self._made.pop(key, None)
        finalizers = [f for f in namespace.finalizers if f != FINALIZER]
        # False: it changed meanwhile; its watch event brings the next pass.
        return not await self._api.set_namespace_finalizers(
            key.name, finalizers, namespace.meta.resource_version
        )

    def _auto_objects(self) -> NamespaceNetworkObjects:
        if self._objects is None:
            raise NamespaceNetworkNotReady(
                "kubernetes.subnet_pool and kubernetes.cluster_router are not set: podwire"
                " cannot make or delete namespace networks"
            )
        return self._objects

    def _warm(self, network_id: str) -> None:
        """Pools of the network on every live node, filled in the background once a term."""
        if self._warm_ports <= 0 or network_id in self._warmed:
            return
        self._warmed.add(network_id)
        self._service.spawn(self._fill(network_id))

    async def _fill(self, network_id: str) -> None:
        for node in sorted(await self._service.liveness.alive_nodes()):
            try:
                await self._admin.populate(
                    [node], network_id, self._settings.project_id, (), self._warm_ports
                )
            except PodwireError as exc:
                log.info("controller.namespace_network.not_warmed", network=network_id,
                         node=node, error=str(exc))  # fmt: skip

    def _report(self, namespace: K8sNamespace, message: str) -> None:
        """Once per problem and namespace: a pass every few seconds must not repeat it."""
        key = namespace.meta.key
        if self._told.get(key) == message:
            return
        self._told[key] = message
        log.warning("controller.namespace_network.problem", namespace=key.name, error=message)
        if self.on_problem is not None:
            self.on_problem(key.name, namespace.meta.uid, message)

    async def network_for(self, pod: PodRef) -> str | None:
        """The network of the pod's namespace: None for the node's own (no annotation).
        Refuses as retryable what is not there yet or is wrong, naming the namespace."""
        lacking = ["the Kubernetes API has not been read yet in this term"]
        try:
            async with asyncio.timeout(NETWORK_WAIT):
                # Every pass (the first once the informers listed, then one after each
                # namespace event) wakes the waiters.
                while (watcher := self._watcher) is None:
                    await self.passed.wait()
                key = ObjectKey("", pod.namespace)
                lacking[0] = "the namespace is not known to the Kubernetes API yet"
                while (namespace := watcher.namespaces.objects.get(key)) is None:
                    await self.passed.wait()
                return await self._network_of(namespace, lacking)
        except TimeoutError as exc:
            if self._watcher is None and (away := self.api_problem()) is not None:
                lacking[0] = f"the Kubernetes API is not answering: {away}"
            raise NamespaceNetworkNotReady(
                f"network of namespace {pod.namespace} (pod {pod.name}) not decided after"
                f" {NETWORK_WAIT:.0f} s: {lacking[0]}; retry"
            ) from exc

    async def _network_of(self, namespace: K8sNamespace, lacking: list[str]) -> str | None:
        try:
            choice = network_choice(namespace, self._settings)
        except PodwireError as exc:
            raise NamespaceNetworkNotReady(f"{exc}; retry once it is fixed") from exc
        if choice.kind is Kind.DEFAULT:
            return None
        if choice.kind is Kind.NAMED:
            return await self._named(namespace, choice)
        key = namespace.meta.key
        lacking[0] = f"its network ({NETWORK_ANNOTATION}: auto) is being made"
        while (made := self._made.get(key)) is None or made[0] != namespace.meta.uid:
            if self._told.get(key):
                lacking[0] = self._told[key]
            await self.passed.wait()
        return made[1]
