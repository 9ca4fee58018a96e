"""Dead-node cleanup: pools of nodes that stopped reporting alive are freed, with a grace;
everything such a node held is released once it has been dead for ``pool.node_release_after``.

A node's pools are only freed when it was found dead on two consecutive passes, and an unbound
port of ours only deleted when seen unbound twice: a node restarting, or a port being created
right now, must not lose its ports to one unlucky pass. Its in-use ports wait much longer (an
agent restart or a network partition must not take running pods' ports): the time counts from
the first pass of this controller process that found the node dead.
"""

from __future__ import annotations

import time

from podwire.controller.neutron_ops import PortOps
from podwire.controller.pool_admin import PoolAdmin
from podwire.controller.pool_service import PoolService
from podwire.controller.vif_broker import VifBroker
from podwire.log import get_logger
from podwire.neutron.vifs import is_bound
from podwire.schema.vif import DEVICE_OWNER

log = get_logger(__name__)


class NodeSweeper:
    def __init__(
        self,
        service: PoolService,
        broker: VifBroker,
        admin: PoolAdmin,
        neutron: PortOps,
        release_after: float,
    ) -> None:
        """``release_after``: seconds dead before all a node held is released; 0: never."""
        self._service = service
        self._broker = broker
        self._admin = admin
        self._neutron = neutron
        self._release_after = release_after
        self._dead_before: set[str] = set()
        self._dead_since: dict[str, float] = {}
        self._unbound_before: set[str] = set()

    async def sweep_once(self) -> tuple[set[str], int]:
        """One pass; returns the nodes whose pools were freed and the unbound ports deleted."""
        dead = await self._dead_nodes()
        await self._release_long_dead(dead)
        freeing = dead & self._dead_before
        self._dead_before = dead - freeing
        if freeing:
            await self._admin.remove_nodes(freeing)
            log.info("controller.nodes_removed", nodes=sorted(freeing))
        return freeing, await self._sweep_unbound()

    async def _dead_nodes(self) -> set[str]:
        """Nodes with pools or attachments here but no live agent."""
        alive = await self._service.liveness.alive_nodes()
        known = {key.node for key in self._service.pools.pool_keys()}
        return (known | {node for node, _ in self._service.attachments}) - alive

    async def _release_long_dead(self, dead: set[str]) -> None:
        now = time.monotonic()
        self._dead_since = {node: self._dead_since.get(node, now) for node in dead}
        if not self._release_after:
            return
        for node, since in sorted(self._dead_since.items()):
            if now - since >= self._release_after:
                await self._broker.remove_node(node, "dead")
                del self._dead_since[node]

    async def _sweep_unbound(self) -> int:
        ports = await self._neutron.owned_ports(DEVICE_OWNER)
        unbound = {
            str(p.id) for p in ports if not is_bound(p) and not self._service.knows(str(p.id))
        }
        doomed = unbound & self._unbound_before
        self._unbound_before = unbound - doomed
        for port_id in doomed:
            await self._neutron.delete_port(port_id)
        if doomed:
            log.info("controller.unbound_ports_deleted", count=len(doomed))
        return len(doomed)
