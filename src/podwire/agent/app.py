"""``podwire agent``: every part of the node agent under one TaskGroup.

Start order matters: the heartbeat goes first (Neutron binds ports to this host only while it
is alive), then the binder's first listing, then the CNI socket opens, so the first ADD finds
the host registered and the plumbing adopted. Shutdown revokes the heartbeat at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podwire import keys
from podwire.agent.cni.server import CniServer
from podwire.agent.cni_handler import CniHandler, HandlerSettings, ReadyCheck
from podwire.agent.fabric.binder import Binder, BinderSettings
from podwire.agent.fabric.peers import PeerTracker
from podwire.agent.fabric.registration import VIF_TYPES, Heartbeat, HostPresence
from podwire.agent.metrics import AgentMetrics
from podwire.agent.policy.enforcer import EnforcerSettings, PolicyEnforcer
from podwire.agent.ports import checkpoint as checkpoints
from podwire.agent.ports.attach import Attacher
from podwire.agent.ports.checkpoint import EntryStore
from podwire.agent.ports.embedded_plugin import EmbeddedPlugin
from podwire.agent.ports.memif import MemifService
from podwire.agent.ports.taps import TapPorts
from podwire.agent.ports.veth import Plugger, is_nested
from podwire.agent.services.pods import PodServices
from podwire.agent.vifs.controller_vifs import ControllerVifSource
from podwire.agent.vifs.podrelease import PodReleaser
from podwire.agent.vifs.vifsource import VifSource
from podwire.backoff import Supervised
from podwire.config import Settings
from podwire.deviceplugin import DevicePlugin
from podwire.deviceplugin.metrics import StatsCollector
from podwire.errors import ConfigError, PodwireError
from podwire.etcd import EtcdClient
from podwire.etcd.errors import EtcdPermissionDenied
from podwire.health import Health, first_problem
from podwire.log import get_logger
from podwire.memif import build as memif_build
from podwire.netfilter import Nftables
from podwire.netlink import HostNetlink, PodNetlink, tun_available
from podwire.ops_http import OpsServer
from podwire.schema import nodes as node_values
from podwire.schema.checkpoints import Attachment
from podwire.schema.nodes import MemifPortState
from podwire.schema.ports import DesiredPort
from podwire.schema.vif import Vif

log = get_logger(__name__)

LAST_SWEEP_SECONDS = 2.0


def _pod_services(
    stack: contextlib.AsyncExitStack, etcd: EtcdClient, checkpoint: EntryStore[Attachment]
) -> PodServices:
    """The Services in this node's pods (its kernel dataplane's pods only)."""
    services = PodServices(etcd, lambda: checkpoint.entries)
    stack.callback(services.close)
    return services


def vlan_capable() -> bool:
    """Whether this kernel can make VLAN sub-interfaces (the 8021q module is loaded)."""
    return os.path.exists("/proc/net/vlan") or os.path.exists("/sys/module/8021q")


def network_types() -> list[str]:
    return ["flat", "vlan", "vxlan"] if vlan_capable() else ["flat", "vxlan"]


@dataclass
class AgentParts:
    """What a running agent exposes to tests and the CLI."""

    binder: Binder | None = None
    peers: PeerTracker | None = None
    heartbeat: Heartbeat | None = None
    handler: CniHandler | None = None
    memif: MemifService | None = None
    policy: PolicyEnforcer | None = None
    taps: TapPorts | None = None
    services: PodServices | None = None
    plugin: DevicePlugin | None = None
    tasks: list[Supervised] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class NodeDataplane:
    policy: PolicyEnforcer | None = None
    attacher: Attacher | None = None
    memif: MemifService | None = None
    taps: TapPorts | None = None


class Agent:
    def __init__(self, settings: Settings, vifs: VifSource | None = None) -> None:
        agent = settings.agent
        if not agent.host:
            raise ConfigError("agent.host: required (this node's name as Neutron knows it)")
        self.settings = settings
        self._vifs = vifs
        self.metrics = AgentMetrics()
        self.parts = AgentParts()

    async def run(self) -> None:
        """Run until cancelled; an unreachable etcd is waited for, a permanent error leaves."""
        settings = self.settings
        agent = settings.agent
        etcd = await EtcdClient.connect(
            settings.etcd, check=False, namespace=settings.deployment.etcd_namespace
        )  # registration waits for it
        try:
            async with contextlib.AsyncExitStack() as stack:
                kernel: tuple[HostNetlink, PodNetlink] | None = None
                if agent.dataplane == "linux":
                    kernel = (HostNetlink(agent.host_netns), PodNetlink())
                    stack.callback(kernel[0].close)
                    stack.callback(kernel[1].close)
                await self._serve(stack, etcd, kernel)
        finally:
            await etcd.close()

    def _collect_stats(self, stack: contextlib.AsyncExitStack, plugin: DevicePlugin) -> None:
        collector = StatsCollector(plugin.stats)
        self.metrics.registry.register(collector)
        stack.callback(self.metrics.registry.unregister, collector)

    def _live(self) -> dict[str, Any]:
        """Parts restarted after a failure, for ``/healthz``."""
        restarted = {
            task.name: {"restarts": task.restarts, "last_error": task.last_error}
            for task in self.parts.tasks
            if task.restarts
        }
        return {"restarted": restarted} if restarted else {}

    async def _start_ops(self, stack: contextlib.AsyncExitStack, ready: ReadyCheck) -> None:
        ops = OpsServer(self.settings.agent.ops_listen, ready, self.metrics.registry, self._live)
        await ops.start()
        stack.push_async_callback(ops.stop)

    async def _serve(
        self,
        stack: contextlib.AsyncExitStack,
        etcd: EtcdClient,
        kernel: tuple[HostNetlink, PodNetlink] | None,
    ) -> None:
        """Everything under one TaskGroup; without ``kernel`` (``agent.dataplane = "none"``)
        the binder only reports ports wired and no CNI socket is served."""
        agent = self.settings.agent
        vifs = self._vifs or await _default_vifs(self.settings, stack)
        plugin = _device_plugin(self.settings)
        memif_binary = _memif_binary(self.settings, plugin)
        heartbeat = Heartbeat(
            etcd,
            _presence(self.settings, kernel is not None, memif_binary is not None),
            self.metrics,
        )
        await heartbeat.register()
        stack.push_async_callback(heartbeat.revoke)
        binder = Binder(
            etcd,
            kernel[0] if kernel else None,
            BinderSettings(agent.host, agent.vtep_ip, agent.physnet_mappings, vlan_capable()),
            self.metrics,
        )
        stack.push_async_callback(_last_sweep, binder)  # runs before the heartbeat's revoke
        peers = PeerTracker(etcd, agent.host, binder.set_peers, agent.vtep_ip, self.metrics)
        checkpoint = _load_checkpoint(agent.state_dir, vifs)
        node = self._dataplane(stack, etcd, binder, vifs, plugin, memif_binary, kernel)
        memif, policy, taps = node.memif, node.policy, node.taps
        releaser = self._releaser(stack, plugin)
        services = _pod_services(stack, etcd, checkpoint) if kernel is not None else None

        embedded = EmbeddedPlugin(plugin) if plugin is not None else None
        watched = [heartbeat.health, binder.watcher.health, *peers.healths]
        watched += [part.health for part in (policy and policy.watcher, taps) if part]
        watched += [services.watcher.health] if services is not None else []
        parts = (embedded, releaser, policy, taps, services)
        tasks = self._supervised(heartbeat, binder, peers, *parts)
        aside = [part.health for part in (embedded, *tasks) if part is not None]

        async def ready() -> tuple[bool, str]:
            found = await _readiness(etcd, agent.host, heartbeat, binder, vifs, watched)
            return _with_problems_aside(found, aside)

        handler = None
        if node.attacher is not None and kernel is not None:
            handler = CniHandler(
                HandlerSettings(
                    agent.host, agent.cni_timeout, agent.nested_uplink, agent.host_netns
                ),
                vifs,
                node.attacher,
                Plugger(*kernel),
                checkpoint,
                ready,
                releaser,
                self.metrics,
                memif,
                services,
            )
        self.parts.binder, self.parts.heartbeat, self.parts.handler = binder, heartbeat, handler
        self.parts.peers, self.parts.plugin, self.parts.services = peers, plugin, services
        self.parts.memif, self.parts.policy, self.parts.taps = memif, policy, taps
        async with asyncio.TaskGroup() as tg:
            for task in tasks:
                tg.create_task(task.run())
            await self._restore(tg, checkpoint)
            if handler is not None:
                await self._serve_cni(stack, tg, handler)
            if agent.ops_listen:
                await self._start_ops(stack, ready)
            log.info(
                "agent.started",
                host=agent.host,
                dataplane=agent.dataplane,
                socket=agent.cni_socket if handler else None,
            )
            self.parts.started.set()

    def _supervised(
        self,
        heartbeat: Heartbeat,
        binder: Binder,
        peers: PeerTracker,
        *others: EmbeddedPlugin | PodReleaser | PolicyEnforcer | TapPorts | PodServices | None,
    ) -> list[Supervised]:
        """Each long-running part restarted on its own failures (a part that lost a batch
        half-way re-lists what it follows before it runs again)."""
        tasks = [
            self._supervise("heartbeat", heartbeat.run),
            self._supervise("binder", binder.run, binder.watcher.replay),
            self._supervise("peers", peers.run, peers.replay),
        ]
        for part in others:
            if part is not None:
                replay = None
                if isinstance(part, PolicyEnforcer | PodServices):
                    replay = part.watcher.replay
                tasks.append(self._supervise(type(part).__name__, part.run, replay))
        self.parts.tasks.extend(tasks)
        return tasks

    def _supervise(
        self,
        name: str,
        job: Callable[[], Awaitable[None]],
        replay: Callable[[], None] | None = None,
    ) -> Supervised:
        restarts = self.metrics.task_restarts.labels(name)

        def before_restart() -> None:
            restarts.inc()
            if replay is not None:
                replay()

        return Supervised(name, job, before_restart, fatal=(ConfigError, EtcdPermissionDenied))

    async def _serve_cni(
        self, stack: contextlib.AsyncExitStack, tg: asyncio.TaskGroup, handler: CniHandler
    ) -> None:
        """The CNI socket opens, and what it plugged is kept as it plugged it."""
        server = CniServer(self.settings.agent.cni_socket, handler)
        await server.start()
        stack.push_async_callback(server.stop)
        repairs = self._supervise("attachment-repair", handler.repair_forever)
        self.parts.tasks.append(repairs)
        tg.create_task(repairs.run())

    async def _restore(self, tg: asyncio.TaskGroup, checkpoint: EntryStore[Attachment]) -> None:
        """What was plugged before this start is known again, and keeps its rules: the
        desired ports listed, memif masters adopted, tap devices listed, then the first
        application of the rules, with all of them in it."""
        parts = self.parts
        assert parts.binder is not None
        await parts.binder.synced.wait()
        if parts.memif is not None:
            await parts.memif.restore()
            memif = self._supervise("memif", parts.memif.run)
            parts.tasks.append(memif)
            tg.create_task(memif.run())
        if parts.taps is not None:
            await parts.taps.listed.wait()
        plugged = _plugged_ports(checkpoint, parts.memif, parts.binder, parts.taps)
        await _enforce_plugged(parts.policy, plugged)

    def _releaser(
        self, stack: contextlib.AsyncExitStack, plugin: DevicePlugin | None
    ) -> PodReleaser | None:
        if plugin is None:
            return None
        releaser = PodReleaser(plugin.release_pod, self.settings.agent.pod_release_grace)
        stack.push_async_callback(releaser.close)
        self._collect_stats(stack, plugin)
        return releaser

    def _dataplane(
        self,
        stack: contextlib.AsyncExitStack,
        etcd: EtcdClient,
        binder: Binder,
        vifs: VifSource,
        plugin: DevicePlugin | None,
        memif_binary: Path | None,
        kernel: tuple[HostNetlink, PodNetlink] | None,
    ) -> NodeDataplane:
        """The parts that need the kernel: the port filter, the one attach pipeline, and the
        port kinds beside the CNI's veths (memif taps, adopted tap devices)."""
        if kernel is None:
            return NodeDataplane()
        policy = self._policy(stack, etcd, binder)
        attacher = Attacher(binder, policy)
        memif = _memif_service(
            self.settings,
            plugin,
            memif_binary,
            (vifs, attacher, kernel[0], etcd),
            self.metrics,
            classifies=policy is not None,
        )
        if memif is not None:
            binder.port_listeners.append(memif.port_changed)
            if policy is not None:
                policy.filters = memif  # memif ports' classifiers, in the same pass
        taps = TapPorts(etcd, self.settings.agent.host, kernel[0], attacher, self.metrics)
        binder.devices = taps
        return NodeDataplane(policy, attacher, memif, taps)

    def _policy(
        self, stack: contextlib.AsyncExitStack, etcd: EtcdClient, binder: Binder
    ) -> PolicyEnforcer | None:
        agent = self.settings.agent
        if agent.security_groups == "off":
            return None
        fallbacks = self.metrics.policy_text_fallbacks
        nft = Nftables(agent.host_netns, on_fallback=lambda _reason: fallbacks.inc())
        stack.callback(nft.close)  # the tables stay: they keep enforcing while we are down
        settings = EnforcerSettings(agent.host, agent.security_group_wait)
        policy = PolicyEnforcer(etcd, nft, settings, self.metrics)
        binder.port_listeners.append(policy.port_changed)
        binder.on_remote = policy.remote_changed
        return policy


def _with_problems_aside(found: tuple[bool, str], aside: list[Health]) -> tuple[bool, str]:
    """Parts whose trouble does not make the node unready (CNI still serves) are named."""
    problem = first_problem(aside)
    if not found[0] or problem is None:
        return found
    return True, f"{found[1]}; {problem} (CNI serves meanwhile; retrying)"


async def _last_sweep(binder: Binder) -> None:
    try:
        async with asyncio.timeout(LAST_SWEEP_SECONDS):
            dropped = await binder.drop_stale_state()
    except (PodwireError, TimeoutError) as exc:
        log.warning("agent.stop.state_sweep_failed", error=str(exc) or "timed out")
        return
    if dropped:
        log.info("agent.stop.state_swept", ports=dropped)


async def _enforce_plugged(
    policy: PolicyEnforcer | None, plugged: list[tuple[DesiredPort, str]]
) -> None:
    """Running pods keep their rules: the first application is one atomic replace."""
    if policy is not None:
        policy.adopt(plugged)
        await policy.synced.wait()


def _plugged_ports(
    checkpoint: EntryStore[Attachment],
    memif: MemifService | None,
    binder: Binder,
    taps: TapPorts | None,
) -> list[tuple[DesiredPort, str]]:
    """The ports plugged before this start with their host interfaces: pod veths from the
    checkpoint, memif taps from the memif checkpoint (restored just before, so a memif whose
    grant went meanwhile is no longer among them), the devices of tap ports that are there."""
    found = [
        (_desired(binder, entry.vif), entry.attached.host_ifname)
        for entry in checkpoint.entries.values()
        if not is_nested(entry.attached)
    ]
    if memif is not None:
        found += [(_desired(binder, e.vif), e.tap) for e in memif.checkpoint.entries.values()]
    if taps is not None:
        found += taps.plugged()
    return found


def _desired(binder: Binder, vif: Vif) -> DesiredPort:
    """The port's desired value (or, if the binding is gone meanwhile, what the VIF said:
    still enforced, never left open)."""
    return binder.wired.get(vif.port_id) or DesiredPort(
        vif.port_id,
        vif.network_id,
        vif.mac_address,
        vif.mtu,
        vif.network_type,
        None,
        vif.segmentation_id,
        vif.vif_type,
        tuple(vif.fixed_ips),
        tuple(vif.security_groups),
    )


def _memif_service(
    settings: Settings,
    plugin: DevicePlugin | None,
    binary: Path | None,
    parts: tuple[VifSource, Attacher, HostNetlink, EtcdClient],
    metrics: AgentMetrics,
    classifies: bool,
) -> MemifService | None:
    if plugin is None or binary is None:
        return None
    vifs, attacher, host_nl, etcd = parts
    key = keys.state_memif(settings.agent.host)

    async def publish(ports: list[MemifPortState]) -> None:
        await etcd.put(key, node_values.memif_state_value(ports, time.time()))

    return MemifService(
        settings.memif,
        binary,
        plugin.pod_memif,
        vifs,
        attacher,
        host_nl,
        settings.agent.state_dir,
        metrics,
        publish,
        classifies,
    )


def _presence(settings: Settings, kernel: bool, memif: bool) -> HostPresence:
    """What the node can serve: veth always; tap where it has a data path (it adopts the
    device); memif where it can run masters."""
    agent = settings.agent
    vif_types = [*VIF_TYPES, *(["tap"] if kernel else []), *(["memif"] if memif else [])]
    return HostPresence(
        agent.host,
        agent.heartbeat_ttl,
        agent.vtep_ip,
        agent.physnet_mappings,
        network_types(),
        "nested" if agent.nested_uplink else None,
        tuple(vif_types),
    )


async def _readiness(
    etcd: EtcdClient,
    host: str,
    heartbeat: Heartbeat,
    binder: Binder,
    vifs: VifSource,
    healths: list[Health],
) -> tuple[bool, str]:
    # A read of our own key, not etcd's Status: Status answers even when etcd no longer
    # accepts this agent's token, and the agent would look ready while it cannot see a thing.
    try:
        if await etcd.get(keys.state_alive(host)) is None:
            return False, "heartbeat key is missing in etcd; re-registering"
    except PodwireError as exc:
        return False, f"etcd: {exc}"
    if not heartbeat.healthy:
        return False, "heartbeat lease lost; re-registering"
    problem = first_problem(healths)
    if problem is not None:
        return False, problem
    if not binder.synced.is_set():
        return False, "binder has not listed the desired ports yet"
    return await vifs.healthy()


def _load_checkpoint(state_dir: str, vifs: VifSource) -> EntryStore[Attachment]:
    """This node's attachments; a controller's listings settle its disputes with them (a port
    several records hold after a restore stays with the attachment the checkpoint names)."""
    checkpoint = checkpoints.attachments(state_dir)
    checkpoint.load()
    if isinstance(vifs, ControllerVifSource):
        vifs.claims = lambda: {key: entry.vif.port_id for key, entry in checkpoint.entries.items()}
    return checkpoint


async def _default_vifs(settings: Settings, stack: contextlib.AsyncExitStack) -> VifSource:
    agent = settings.agent
    if agent.vif_source == "neutron":
        from podwire.agent.vifs.neutron_vifs import NeutronVifSource
        from podwire.neutron.client import connect

        return NeutronVifSource(connect(settings.neutron), agent.host, settings.deployment.tag)
    source = ControllerVifSource(agent.controller_url, agent.host, agent.token)
    stack.push_async_callback(source.close)  # its HTTP session, last (after the CNI socket)
    return source


def _memif_binary(settings: Settings, plugin: DevicePlugin | None) -> Path | None:
    """The memif master program when this node can serve memif (capabilities say so only
    then): memif on, the device plugin granting sockets, the master built, taps possible."""
    if not settings.memif.enabled or plugin is None:
        return None
    binary = memif_build.find(settings.memif.binary)
    if binary is None or not tun_available():
        log.warning(
            "agent.memif.unavailable",
            binary=str(binary) if binary else "not built (scripts/setup, podwire memif build)",
            tun=tun_available(),
        )
        return None
    return binary


def _device_plugin(settings: Settings) -> DevicePlugin | None:
    return DevicePlugin(settings.deviceplugin) if settings.deviceplugin.enabled else None
