"""The admin API's side of a term: pools filled, shrunk and freed on an operator's (or the
sweeper's) word."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from podwire.controller.errors import NodeNotPooled
from podwire.controller.pool_service import PoolDeps, PoolService
from podwire.errors import ValidationError
from podwire.log import get_logger
from podwire.schema.inuse import PoolKey, sg_key
from podwire.schema.vif import Vif

log = get_logger(__name__)


class PoolAdmin:
    def __init__(self, service: PoolService, deps: PoolDeps) -> None:
        self._service = service
        self._term = service.term
        self._deps = deps

    async def remove_nodes(self, nodes: Iterable[str]) -> int:
        """Free the pools of removed nodes and forget their drivers; returns ports freed."""
        nodes = set(nodes)
        freed = await self.free_nodes(nodes)
        for node in nodes:
            self._deps.drivers.forget(node)
        return freed

    async def populate(
        self,
        nodes: Iterable[str],
        network_ref: str,
        project_id: str | None,
        security_groups: Iterable[str],
        count: int,
    ) -> dict[str, int]:
        self._service.check_serving()
        sgs = sg_key(security_groups)
        network = await self._deps.neutron.network(network_ref, project_id)
        await self._deps.neutron.check_security_groups(sgs, project_id or network.project_id)
        nodes = list(nodes)
        for node in nodes:  # all before any port is made: a refused populate changes nothing
            await self._deps.liveness.require(node)
            await self._require_pooled(node)
        created: dict[str, int] = {}
        for node in nodes:
            driver = await self._deps.drivers.for_node(node)
            key = PoolKey(node, project_id or network.project_id, network.id)
            self._check_max(key, count)
            created[node] = await self._term.refiller.refill(key, sgs, driver, network, count)
        return created

    async def _require_pooled(self, node: str) -> None:
        """A node of the unpooled driver has no pool: populating it would make nothing."""
        driver = await self._deps.drivers.for_node(node)
        if not driver.pooled:
            raise NodeNotPooled(
                f"node {node} uses the {driver.name} pod driver, which keeps no pool (a port is"
                " made per request): there is nothing to populate"
            )

    def _check_max(self, key: PoolKey, count: int) -> None:
        room = self._deps.settings.max - self._term.pools.size(key)
        if self._deps.settings.max and count > room:
            raise ValidationError(
                f"count: pool {tuple(key)} has room for {max(room, 0)} more ports (pool.max)"
            )

    async def shrink_idle(self) -> int:
        """Delete free ports above the target of pools idle for ``pool.idle_ttl``; returns
        how many were deleted."""
        now = time.monotonic()
        shrinking = []
        for key in self._term.pools.pool_keys():
            surplus = self._term.refiller.sizer.surplus(key, self._term.pools.size(key), now)
            if surplus > 0 and not self._term.refiller.busy(key):
                shrinking.append(self._shrink(key, self._term.pools.take_surplus(key, surplus)))
        # All pools at once: a churn that ends on many nodes leaves each its surplus together.
        results = await asyncio.gather(*shrinking, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(r for r in results if isinstance(r, int))

    async def _shrink(self, key: PoolKey, vifs: list[Vif]) -> int:
        driver = await self._deps.drivers.for_node(key.node)
        try:
            await driver.delete(key, vifs)
        except BaseException:
            self._term.pools.add(key, vifs, oldest=True)  # still in Neutron: keep them pooled
            raise
        log.info("pool.shrunk", key=key, deleted=len(vifs), size=self._term.pools.size(key))
        return len(vifs)

    async def free_nodes(self, nodes: Iterable[str]) -> int:
        wanted = set(nodes)
        freed = 0
        for key in [k for k in self._term.pools.pool_keys() if k.node in wanted]:
            freed += await self._free_key(key)
        return freed

    async def _free_key(self, key: PoolKey) -> int:
        vifs = self._term.pools.remove_key(key)
        driver = await self._deps.drivers.for_node(key.node)
        await driver.delete(key, vifs)
        log.info("pool.freed", key=key, ports=len(vifs))
        return len(vifs)

    async def delete_network_pools(self, network_id: str) -> int:
        freed = 0
        for key in [k for k in self._term.pools.pool_keys() if k.network_id == network_id]:
            freed += await self._free_key(key)
        self._deps.neutron.forget_network(network_id)
        return freed

    async def remove_security_group(self, sg_id: str, network_id: str | None) -> int:
        moved = self._term.pools.strip_sg(sg_id, network_id)
        results = await asyncio.gather(
            *(self._deps.neutron.update_port(v.port_id, security_group_ids=[]) for v in moved),
            return_exceptions=True,
        )
        self._deps.neutron.forget_security_group(sg_id)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        log.info("pool.sg_removed", sg=sg_id, network=network_id, ports=len(moved))
        return len(moved)
