"""Wires a controller together and runs it: HTTP first (not ready), then leader terms.

Each term (won by the election) recovers the pools, then serves, with the periodic recycler,
the node sweeper and the background refills in one TaskGroup. A lost lease ends the term, not
the process: the controller stops serving (agents fail over to another controller), forgets
the term's state and campaigns again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web

from podwire.backoff import Backoff
from podwire.config import Settings
from podwire.controller.api import ControllerApi
from podwire.controller.drivers import BaremetalDriver, NodeDrivers, PortDriver, UnpooledDriver
from podwire.controller.follow import MirrorFollower
from podwire.controller.inuse import InUseStore
from podwire.controller.leader import advertised_url, controller_election, leader_url
from podwire.controller.liveness import Liveness
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.mirror import MirrorFacts
from podwire.controller.nested import NestedDriver, VlanAllocator
from podwire.controller.neutron_ops import NeutronOps
from podwire.controller.pool_admin import PoolAdmin
from podwire.controller.pool_service import PoolDeps, PoolService
from podwire.controller.recovery import RecoveryReport, recover, verify
from podwire.controller.recycler import recycle_once
from podwire.controller.sweeper import NodeSweeper
from podwire.controller.term import TermGuard
from podwire.controller.vif_broker import VifBroker
from podwire.errors import PodwireError
from podwire.etcd.client import EtcdClient, Lease
from podwire.k8s.api import KubeApi
from podwire.kubeside.gone_nodes import GoneNodes
from podwire.kubeside.gone_pods import GonePods
from podwire.kubeside.metrics import KubeMetrics
from podwire.kubeside.ns_networks import NamespaceNetworks
from podwire.kubeside.pod_annotations import PodAnnotator
from podwire.kubeside.policy_ports import PolicyPorts
from podwire.kubeside.service_publish import ServicePublisher
from podwire.kubeside.side import KubernetesSide
from podwire.log import get_logger
from podwire.neutron.client import NeutronClient, NeutronUnavailable, PortSummary
from podwire.neutron.netpol import NetpolObjects
from podwire.schema.vif import DEVICE_OWNER

log = get_logger(__name__)

NEUTRON_PROBE = 5.0  # seconds between the leader's Neutron probes (readiness names an outage)
NETPOL_NAME_PREFIX = "podwire-"  # with the deployment's tag: the groups the reconciler owns


class Controller:
    def __init__(
        self,
        settings: Settings,
        etcd: EtcdClient,
        neutron: NeutronClient,
        identity: str | None = None,
        election_ttl: int = 10,
    ) -> None:
        self.settings = settings
        self.etcd = etcd
        self.metrics = ControllerMetrics()
        # Exported only with [kubernetes], beside the pools' metrics on the same registry.
        kube_registry = self.metrics.registry if settings.kubernetes.kubeconfig else None
        self.kube_metrics = KubeMetrics(kube_registry)
        self._neutron_client = neutron
        self.kubernetes: KubernetesSide | None = None  # with [kubernetes], once run() began
        self.port = 0  # the API's, once listening
        self.leadership = controller_election(
            etcd, identity or f"{socket.gethostname()}:{os.getpid()}", self.url, election_ttl
        )
        self.term = TermGuard()
        self.neutron = NeutronOps(neutron, self.metrics, self.term, settings.deployment)
        port_debug = settings.pool.port_debug
        self.nested = NestedDriver(
            self.neutron, port_debug, VlanAllocator(), settings.pool.nested_trunks
        )
        drivers: dict[str, PortDriver] = {
            "baremetal": BaremetalDriver(self.neutron, port_debug, settings.pool.binding_retries),
            "nested": self.nested,
            "unpooled": UnpooledDriver(self.neutron, port_debug, settings.pool.binding_retries),
        }
        deps = PoolDeps(
            settings.pool,
            self.neutron,
            NodeDrivers(etcd, drivers, settings.pool.default_driver),
            InUseStore(etcd, self.leadership.fence, self.metrics.inuse_retries.inc),
            self.metrics,
            Liveness(etcd),
        )
        self.service = PoolService(deps)
        self.admin = PoolAdmin(self.service, deps)
        self.broker = VifBroker(self.service, self.admin, deps)
        release_after = settings.pool.node_release_after
        self.sweeper = NodeSweeper(
            self.service, self.broker, self.admin, self.neutron, release_after
        )
        self.mirror = MirrorFacts(etcd)
        self.follower: MirrorFollower | None = None  # the current term's
        self.api = ControllerApi(
            self.service,
            self.broker,
            self.admin,
            settings.controller,
            (self.ready, self.metrics.registry),
            self.term,
            lambda: leader_url(etcd),
        )
        self._runner: web.AppRunner | None = None
        self.recovery: RecoveryReport | None = None  # the current term's (readiness names it)

    def url(self) -> str:
        """Where this controller serves (what it writes into the election key)."""
        return advertised_url(self.settings.controller, self.port)

    async def ready(self) -> tuple[bool, str]:
        """Ready only on the serving leader (the Service routes agents to it); Neutron's
        trouble is named, but keeps the leader ready: warm pools serve without Neutron."""
        neutron = self.neutron.problem()
        kubernetes = self.kubernetes.problem() if self.kubernetes is not None else None
        notes = [f"neutron: {neutron}"] if neutron else []
        if kubernetes and self.service.serving:
            notes.append(f"kubernetes: {kubernetes}")
        note = "; ".join(notes)
        if self.service.serving:
            return True, f"leader, {self._recovered()}" + (f"; {note}" if note else "")
        if self.leadership.is_leader:
            return False, "leader, recovering pools" + (f": {note}" if note else "")
        if self.leadership.losses:
            return False, "standby: leadership was lost, campaigning again"
        return False, "standby or recovering"

    def _recovered(self) -> str:
        """Pools recovered from the forwarder's mirror are served at once and checked against
        Neutron behind (leftovers deleted, vanished ports dropped): readiness says which."""
        report = self.recovery
        if report is not None and report.source == "etcd" and not report.verified:
            return "pools recovered from etcd, checking them against Neutron"
        return "pools recovered"

    async def start_http(self) -> None:
        host, _, port = self.settings.controller.listen.rpartition(":")
        self._runner = web.AppRunner(self.api.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, int(port))
        await site.start()
        server = getattr(site, "_server", None)
        self.port = int(server.sockets[0].getsockname()[1]) if server else int(port)
        log.info("controller.listening", host=host, port=self.port)

    async def run(self) -> None:
        """Serve leader terms until cancelled; only a permanent error leaves."""
        await self.open_kubernetes()
        try:
            await self.start_http()
            await self.leadership.lead(self._term)
        finally:
            self.service.serving = False
            await self.stop()

    async def open_kubernetes(self) -> None:
        """Before anything else: a kubeconfig that is missing, unreadable or unusable stops
        the process at start (ConfigError naming the file), never later in a term. Nothing
        here reaches the apiserver: its absence is a term's business, retried there."""
        kubernetes = self.settings.kubernetes
        path = kubernetes.kubeconfig_path()
        if path is None or self.kubernetes is not None:
            return
        api = await KubeApi.from_kubeconfig(path)
        objects = NetpolObjects(
            self._neutron_client.connection,
            kubernetes.project_id,
            self.settings.deployment.tag,
            NETPOL_NAME_PREFIX,
        )
        ports = PolicyPorts(self.service, self.broker, self.admin, kubernetes.project_id)
        self.kubernetes = KubernetesSide(
            api,
            objects,
            self.term.check,
            self.kube_metrics,
            kubernetes.project_id,
            ports=ports,
            gone=GonePods(self.service, self.broker.release, api.pod, kubernetes.gone_pod_grace),
            nodes=GoneNodes(self.service, self.broker.remove_node),
            annotator=PodAnnotator(self.service, api.patch_pod, self._ports_of_pod),
            services=ServicePublisher(self.etcd, self.leadership.fence),
            namespaces=NamespaceNetworks.for_settings(
                self.settings,
                api,
                self._neutron_client.connection,
                self.service,
                self.admin,
                self.term.check,
            ),
        )
        self.broker.pod_groups = self.kubernetes.pod_groups
        self.broker.pod_failed = self.kubernetes.pod_failed
        self.broker.pod_network = self.kubernetes.pod_network
        log.info("controller.kubernetes.configured", kubeconfig=str(path), server=api.server)

    async def _ports_of_pod(self, uid: str) -> list[PortSummary]:
        """The ports an agent with ``vif_source = "neutron"`` made for a pod (its uid is
        their device_id): no in-use record holds them."""
        return await self.neutron.list_port_summaries(device_owner=DEVICE_OWNER, device_id=uid)

    async def _term(self, _lease: Lease) -> None:
        self.term.begin(self.leadership.terms)
        follower = self.follower = MirrorFollower(self.etcd)
        try:
            report = self.recovery = await self._recover(follower)
            async with asyncio.TaskGroup() as group:
                group.create_task(follower.run(self.service))
                group.create_task(self._watch_neutron())
                if self.kubernetes is not None:
                    group.create_task(self.kubernetes.run(), name="kubernetes")
                # The recovered ports are handed out once the mirror shows them.
                await follower.synced.wait()
                group.create_task(self.service.run_background())
                if report.source == "etcd":
                    group.create_task(self._verify(report))
                group.create_task(
                    self._every(
                        self.settings.pool.update_interval, self._recycle, self._recycle_wake
                    )
                )
                group.create_task(
                    self._every(self.settings.pool.node_cleanup_interval, self.sweeper.sweep_once)
                )
                if self.settings.pool.adaptive:
                    group.create_task(self._every(self._shrink_interval(), self._shrink))
                self.service.serving = True
                log.info("controller.serving", term=self.leadership.terms, source=report.source)
        finally:
            self._end_term()

    def _end_term(self) -> None:
        """First of all when a term ends: refuse calls and Neutron writes, and drop the
        pools and attachments (the next leader may hand out those ports at once)."""
        self.service.serving = False
        self.term.end()
        self.service.reset()
        log.info("controller.term_ended", term=self.leadership.terms)

    async def _recover(self, follower: MirrorFollower) -> RecoveryReport:
        """Recovery, repeated with backoff while Neutron is away: the term (and the lease)
        is kept, so an outage of Neutron alone is no reason to elect anyone again."""
        backoff = Backoff(0.5, 10.0)
        while True:
            self.service.reset(follower)
            self.nested.vlans.clear()
            self.nested.forget_trunks()
            try:
                return await recover(self.service, self.neutron, self.nested, self.etcd)
            except NeutronUnavailable as exc:
                delay = backoff.next()
                log.warning("controller.recovery.retry", error=str(exc), delay=delay)
                await asyncio.sleep(delay)

    async def _watch_neutron(self) -> None:
        """Probe Neutron now and then, so readiness names an outage also while nothing
        else asks Neutron anything; logs each change."""
        was: str | None = None
        while True:
            await asyncio.sleep(NEUTRON_PROBE)
            with contextlib.suppress(PodwireError):  # the problem is what NeutronOps keeps
                await self.neutron.probe()
            now = self.neutron.problem()
            if (now is None) != (was is None):
                report = log.info if now is None else log.warning
                report(
                    "controller.neutron.back" if now is None else "controller.neutron.away",
                    problem=now,
                )
            was = now

    async def _verify(self, report: RecoveryReport) -> None:
        """Retried until Neutron answers: until then leftovers simply wait."""
        while True:
            try:
                await verify(self.service, self.neutron, report)
                return
            except PodwireError as exc:
                log.warning("controller.recovery.verify_failed", error=str(exc))
            await asyncio.sleep(self.settings.pool.update_interval)

    def _shrink_interval(self) -> float:
        """Often enough that an idle pool is back at min within a quarter TTL past it."""
        pool = self.settings.pool
        return min(pool.update_interval, pool.idle_ttl / 4)

    async def _shrink(self) -> object:
        return await self.admin.shrink_idle()

    async def _recycle(self) -> object:
        return await recycle_once(self.service, self.neutron, self.settings.pool, self.mirror)

    def _recycle_wake(self) -> asyncio.Event | None:
        """A release starts a pass at once while the mirror answers it (etcd reads); a pass
        that has to list Neutron waits for the interval, so a burst cannot flood Neutron."""
        prompt = self.settings.pool.recycle_on_release and self.mirror.vouched
        return self.service.released if prompt else None

    @staticmethod
    async def _every(
        interval: float,
        job: Callable[[], Awaitable[object]],
        wake: Callable[[], asyncio.Event | None] = lambda: None,
    ) -> None:
        """Run ``job`` every ``interval`` s, or as soon as the event ``wake`` names is set."""
        while True:
            event = wake()
            if event is None:
                await asyncio.sleep(interval)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval):
                        await event.wait()
                event.clear()
            try:
                await job()
            except PodwireError as exc:
                log.warning("controller.periodic_failed", job=job.__name__, error=str(exc))

    async def stop(self) -> None:
        await self.service.drain()
        with contextlib.suppress(PodwireError):
            await self.leadership.resign()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.kubernetes is not None:
            await self.kubernetes.api.close()
            self.kubernetes = None
