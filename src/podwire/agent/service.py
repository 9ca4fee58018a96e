"""``podwire agent``: every part of the node agent under one TaskGroup.

Start order matters: the heartbeat goes first (Neutron binds ports to this host only while it
is alive), then the binder's first listing, then the CNI socket opens, so the first ADD finds
the host registered and the plumbing adopted. Shutdown revokes the heartbeat at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field

from podwire import keys
from podwire.agent.attach import Plugger
from podwire.agent.binder import Binder, BinderSettings
from podwire.agent.checkpoint import Checkpoint
from podwire.agent.cni_handler import CniHandler, HandlerSettings
from podwire.agent.metrics import AgentMetrics
from podwire.agent.peers import PeerTracker
from podwire.agent.podrelease import PodReleaser
from podwire.agent.registration import Heartbeat, HostPresence
from podwire.agent.vifsource import VifSource
from podwire.cni.server import CniServer
from podwire.config import Settings
from podwire.deviceplugin import DevicePlugin
from podwire.deviceplugin.metrics import StatsCollector
from podwire.errors import ConfigError, PodwireError
from podwire.etcd import EtcdClient
from podwire.health import first_problem
from podwire.log import get_logger
from podwire.netlink import HostNetlink, PodNetlink
from podwire.service.ops_http import OpsServer

log = get_logger(__name__)


def vlan_capable() -> bool:
    """Whether this kernel can make VLAN sub-interfaces (the 8021q module is loaded)."""
    return os.path.exists("/proc/net/vlan") or os.path.exists("/sys/module/8021q")


def network_types() -> list[str]:
    return ["flat", "vlan", "vxlan"] if vlan_capable() else ["flat", "vxlan"]


@dataclass
class AgentParts:
    """What a running agent exposes to tests and the CLI."""

    binder: Binder | None = None
    heartbeat: Heartbeat | None = None
    handler: CniHandler | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)


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
        etcd = await EtcdClient.connect(settings.etcd, check=False)  # registration waits for it
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

    async def _serve(
        self,
        stack: contextlib.AsyncExitStack,
        etcd: EtcdClient,
        kernel: tuple[HostNetlink, PodNetlink] | None,
    ) -> None:
        """Everything under one TaskGroup; without ``kernel`` (``agent.dataplane = "none"``)
        the binder only reports ports wired and no CNI socket is served."""
        agent = self.settings.agent
        vifs = self._vifs or await _default_vifs(self.settings)
        heartbeat = Heartbeat(
            etcd,
            HostPresence(
                agent.host,
                agent.heartbeat_ttl,
                agent.vtep_ip,
                agent.physnet_mappings,
                network_types(),
                "nested" if agent.nested_uplink else None,
            ),
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
        peers = PeerTracker(etcd, agent.host, binder.set_peers, agent.vtep_ip)
        checkpoint = Checkpoint(agent.state_dir)
        checkpoint.load()
        plugin, releaser = self._device_plugin(stack)

        async def ready() -> tuple[bool, str]:
            return await _readiness(etcd, agent.host, heartbeat, binder, peers, vifs)

        handler = None
        if kernel is not None:
            handler = CniHandler(
                HandlerSettings(agent.host, agent.cni_timeout, agent.nested_uplink),
                vifs,
                binder,
                Plugger(*kernel),
                checkpoint,
                ready,
                releaser,
                self.metrics,
            )
        self.parts.binder, self.parts.heartbeat, self.parts.handler = binder, heartbeat, handler
        async with asyncio.TaskGroup() as tg:
            tg.create_task(heartbeat.run())
            tg.create_task(binder.run())
            tg.create_task(peers.run())
            if plugin is not None:
                tg.create_task(plugin.run())
            if releaser is not None:
                tg.create_task(releaser.run())
            await binder.synced.wait()
            if handler is not None:
                server = CniServer(agent.cni_socket, handler)
                await server.start()
                stack.push_async_callback(server.stop)
            if agent.ops_listen:
                ops = OpsServer(agent.ops_listen, ready, self.metrics.registry)
                await ops.start()
                stack.push_async_callback(ops.stop)
            log.info(
                "agent.started",
                host=agent.host,
                dataplane=agent.dataplane,
                socket=agent.cni_socket if handler else None,
            )
            self.parts.started.set()

    def _device_plugin(
        self, stack: contextlib.AsyncExitStack
    ) -> tuple[DevicePlugin | None, PodReleaser | None]:
        """The embedded device plugin, its pod releaser and its stats on the agent's /metrics."""
        plugin = _device_plugin(self.settings)
        if plugin is None:
            return None, None
        releaser = PodReleaser(plugin.release_pod, self.settings.agent.pod_release_grace)
        stack.push_async_callback(releaser.close)
        collector = StatsCollector(plugin.stats)
        self.metrics.registry.register(collector)
        stack.callback(self.metrics.registry.unregister, collector)
        return plugin, releaser


async def _readiness(
    etcd: EtcdClient,
    host: str,
    heartbeat: Heartbeat,
    binder: Binder,
    peers: PeerTracker,
    vifs: VifSource,
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
    problem = first_problem([heartbeat.health, binder.watcher.health, peers.watcher.health])
    if problem is not None:
        return False, problem
    if not binder.synced.is_set():
        return False, "binder has not listed the desired ports yet"
    return await vifs.healthy()


async def _default_vifs(settings: Settings) -> VifSource:
    agent = settings.agent
    if agent.vif_source == "neutron":
        from podwire.agent.neutron_vifs import NeutronVifSource
        from podwire.neutron.client import connect

        return NeutronVifSource(connect(settings.neutron), agent.host)
    from podwire.agent.controller_vifs import ControllerVifSource

    return ControllerVifSource(agent.controller_url, agent.host, agent.token)


def _device_plugin(settings: Settings) -> DevicePlugin | None:
    return DevicePlugin(settings.deviceplugin) if settings.deviceplugin.enabled else None
