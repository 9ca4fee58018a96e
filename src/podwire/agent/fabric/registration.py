"""The agent's presence in etcd: heartbeat on a lease, physnets, VTEP and capabilities.

The ml2 driver binds a port to this host only while ``alive`` exists, so the heartbeat is
what makes the host schedulable; losing the lease re-registers instead of silently running on
as a host Neutron believes dead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from podwire import __version__, keys
from podwire.agent.metrics import AgentMetrics
from podwire.backoff import Backoff, retry_forever
from podwire.etcd import EtcdClient, Lease
from podwire.etcd.client import LeaseLost
from podwire.health import Health
from podwire.log import get_logger
from podwire.schema import nodes as values

log = get_logger(__name__)

VIF_TYPES = ["veth"]


@dataclass(frozen=True)
class HostPresence:
    host: str
    ttl: int
    vtep_ip: str
    physnets: dict[str, str]
    network_types: list[str]
    # "nested" on a VM whose pods get trunk subports; None leaves the choice to the controller.
    pod_driver: str | None = None
    # What this node can give a pod: "veth" always, "memif" when it can serve memif masters.
    vif_types: tuple[str, ...] = tuple(VIF_TYPES)


class Heartbeat:
    def __init__(
        self, etcd: EtcdClient, reg: HostPresence, metrics: AgentMetrics | None = None
    ) -> None:
        self._etcd = etcd
        self._metrics = metrics or AgentMetrics()
        self._reg = reg
        self._lease: Lease | None = None
        self.started_at = time.time()
        self.healthy = False
        self.health = Health("heartbeat")

    async def publish(self) -> None:
        """Write the static keys, then the leased ``alive`` key last (it makes us bindable)."""
        reg = self._reg
        for name, interface in reg.physnets.items():
            await self._etcd.put(
                keys.state_physnet(reg.host, name), values.physnet_value(interface)
            )
        if reg.vtep_ip:
            await self._etcd.put(keys.state_vtep(reg.host), values.vtep_value(reg.vtep_ip))
        await self._etcd.put(
            keys.state_capabilities(reg.host),
            values.capabilities_value(list(reg.vif_types), reg.network_types, reg.pod_driver),
        )
        await self._put_alive()

    async def _put_alive(self) -> None:
        self._lease = await self._etcd.grant_lease(self._reg.ttl)
        await self._beat()
        self.healthy = True
        log.info("agent.registered", host=self._reg.host, lease=hex(self._lease.id))

    async def _beat(self) -> None:
        """The alive value with a fresh ``beat_at``: what says this node lives (any etcd user
        can refresh its lease, only this node's can write this)."""
        assert self._lease is not None
        value = values.alive_value(self.started_at, __version__, time.time(), self._reg.ttl)
        await self._etcd.put(keys.state_alive(self._reg.host), value, lease=self._lease.id)

    async def register(self) -> None:
        """``publish`` until it succeeds: an unreachable etcd is waited out, never fatal."""
        await retry_forever("agent registration", self.publish, Backoff(0.2, 2.0), self.health)
        self.health.ok()

    async def run(self) -> None:
        """Keep the lease alive; when it is lost, grant a new one and re-publish."""
        while True:
            assert self._lease is not None
            try:
                await self._lease.keepalive(self._beat)
            except LeaseLost as exc:
                self._metrics.heartbeat_lost.inc()
                self.healthy = False
                self.health.failing(f"heartbeat lease lost ({exc}); re-registering")
                log.warning("agent.lease.lost", host=self._reg.host, error=str(exc))
                await self.register()

    async def revoke(self) -> None:
        """On shutdown: the alive key goes at once instead of after the TTL."""
        if self._lease is not None:
            await self._lease.revoke()
            self._lease = None
            self.healthy = False
            log.info("agent.deregistered", host=self._reg.host)
