"""The pool service: what the VIF API and admin API do, on top of pools, refill and drivers.

Request path, in order of cost: an exact SG match costs no Neutron call; reusing another
group's port costs one port update; an empty pool makes the request wait (first come, first
served) for a refill. In-use attachments go to etcd before the VIF is returned, so a restarted
controller never hands the same port out twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable
from typing import Any

from podwire.config import PoolSettings
from podwire.controller.drivers import NodeDrivers, PortDriver
from podwire.controller.errors import NotServing, PoolNotReady
from podwire.controller.inuse import InUse, InUseStore
from podwire.controller.liveness import Liveness, no_agent
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.netinfo import NetworkInfo
from podwire.controller.neutron_ops import NeutronOps
from podwire.controller.pools import PoolKey, Pools, SgKey, Taken, Waiter, sg_key, with_sgs
from podwire.controller.refill import Refiller
from podwire.errors import PodwireError, ValidationError
from podwire.log import get_logger
from podwire.schema.vif import PodRef, Vif, VifRequest

log = get_logger(__name__)


class PoolService:
    def __init__(
        self,
        settings: PoolSettings,
        pools: Pools,
        neutron: NeutronOps,
        drivers: NodeDrivers,
        store: InUseStore,
        metrics: ControllerMetrics,
        liveness: Liveness,
    ) -> None:
        self.settings = settings
        self.liveness = liveness
        self.pools = pools
        self.neutron = neutron
        self.drivers = drivers
        self.store = store
        self.metrics = metrics
        self.refiller = Refiller(pools, settings, metrics, liveness)
        self.attachments: dict[tuple[str, str], InUse] = {}
        self._pending: dict[tuple[str, str], asyncio.Future[Vif]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._group: asyncio.TaskGroup | None = None
        self.serving = False

    # --- VIF API ---------------------------------------------------------------------------

    async def request(self, node: str, req: VifRequest) -> Vif:
        self._check_serving()
        ident = (node, req.attachment)
        known = self.attachments.get(ident)
        if known is not None:
            return known.vif
        pending = self._pending.get(ident)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Vif] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        try:
            vif = await self._request(node, req)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # a failure nobody else awaited is not an "unretrieved" one
            raise
        finally:
            self._pending.pop(ident, None)
        future.set_result(vif)
        return vif

    async def _request(self, node: str, req: VifRequest) -> Vif:
        network = await self.neutron.network(req.network, req.project_id)
        await self.neutron.check_security_groups(req.security_groups)
        key = PoolKey(node, req.project_id or network.project_id, network.id)
        driver = await self.drivers.for_node(node)
        if driver.pooled:
            vif = await self._from_pool(key, req.security_groups, driver, network)
        else:
            vif = await self._create_one(key, req.security_groups, driver, network)
        record = InUse(node, req.attachment, key, vif)
        try:
            await self.store.put(record)
        except BaseException:
            await self._undo_take(driver, key, vif)
            raise
        self.attachments[(node, req.attachment)] = record
        self.metrics.in_use.set(len(self.attachments))
        if self.settings.port_debug:
            self._spawn(self._name_port(vif.port_id, req))
        return vif

    async def _create_one(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> Vif:
        vifs = await driver.create(key, wanted, 1, network)
        if not vifs:
            raise PoolNotReady(f"the port for pool {tuple(key)} could not be bound; retry")
        return vifs[0]

    async def _from_pool(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> Vif:
        taken = self.pools.take(key, wanted)
        if taken is None:
            self.metrics.misses.inc()
            taken = await self._wait_for_port(key, wanted, driver, network)
        elif taken.sg_update:
            self.metrics.reuses.inc()
        else:
            self.metrics.hits.inc()
        self.metrics.pool_size.labels(*key).set(self.pools.size(key))
        if self.pools.size(key) < self.settings.min and not self.refiller.busy(key):
            self._spawn(self._background_refill(key, wanted, driver, network))
        return await self._apply_sgs(taken)

    async def _wait_for_port(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> Taken:
        got: asyncio.Future[Taken] = asyncio.get_running_loop().create_future()
        waiter = Waiter(wanted, got.set_result)
        self.pools.wait(key, waiter)
        try:
            await self.refiller.refill(key, wanted, driver, network)
        except PodwireError as exc:
            if not got.done():
                waiter.cancelled = True
                raise PoolNotReady(f"pool {tuple(key)} could not be filled: {exc}") from exc
        except BaseException:
            waiter.cancelled = True
            raise
        if not got.done():
            waiter.cancelled = True
            if self.liveness.noted_dead(key.node):
                raise PoolNotReady(f"pool {tuple(key)} is empty: {no_agent(key.node)}")
            raise PoolNotReady(f"pool {tuple(key)} has no port ready yet; retry")
        return got.result()

    async def _apply_sgs(self, taken: Taken) -> Vif:
        if not taken.sg_update:
            return taken.vif
        try:
            await self.neutron.update_port(taken.vif.port_id, security_group_ids=list(taken.wanted))
        except BaseException:
            self.pools.add(taken.key, [taken.vif], oldest=True)
            raise
        vif = with_sgs(taken.vif, taken.wanted)
        self.pools.adopt(taken.key, vif)
        return vif

    async def _undo_take(self, driver: PortDriver, key: PoolKey, vif: Vif) -> None:
        if driver.pooled:
            self.pools.add(key, [vif], oldest=True)
            return
        with contextlib.suppress(PodwireError):
            await driver.delete(key, [vif])

    async def _name_port(self, port_id: str, req: VifRequest) -> None:
        """Debug naming only: a failure costs a name, never the pod's port."""
        try:
            pod = req.pod or PodRef("", "")
            await self.neutron.update_port(port_id, name=pod.name, device_id=pod.uid)
        except PodwireError as exc:
            log.warning("pool.port_naming_failed", port=port_id, error=str(exc))

    async def release(self, node: str, attachment: str) -> None:
        self._check_serving()
        record = self.attachments.get((node, attachment))
        if record is None:
            return
        await self.store.delete(node, attachment)
        if self.attachments.pop((node, attachment), None) is None:
            return  # a concurrent release of the same attachment already handled it
        self.metrics.in_use.set(len(self.attachments))
        driver = await self.drivers.for_node(node)
        if driver.pooled:
            self.pools.release(record.key, record.vif.port_id)
        else:
            self.pools.forget(record.vif.port_id)
            await driver.delete(record.key, [record.vif])

    def node_attachments(self, node: str) -> dict[str, Vif]:
        return {att: r.vif for (n, att), r in self.attachments.items() if n == node}

    # --- background work -------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._group is None:  # the term is ending: the next term's requests refill again
            coro.close()
            return
        task = self._group.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def run_background(self) -> None:
        """Own the background refills and port updates of one leader term, in a TaskGroup.

        An unexpected error in one of them ends the term instead of vanishing with its task.
        When the term ends, what is under way finishes first, so no created port is dropped
        half-way.
        """
        async with asyncio.TaskGroup() as group:
            self._group = group
            try:
                await asyncio.Event().wait()
            finally:
                self._group = None
                await self.drain()

    def reset(self) -> None:
        """Forget a past term's pools and attachments; the next term recovers them afresh.

        Another controller may have led meanwhile and handed out what this one still holds
        in memory, so nothing of the old term is trusted.
        """
        self.pools = Pools()
        self.refiller = Refiller(self.pools, self.settings, self.metrics, self.liveness)
        self.attachments.clear()
        self.metrics.in_use.set(0)

    async def _background_refill(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> None:
        try:
            await self.refiller.refill(key, wanted, driver, network)
        except PodwireError as exc:
            log.warning("pool.refill_failed", key=key, error=str(exc))

    async def drain(self) -> None:
        """Wait for background refills and port updates (tests and shutdown use it)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def _check_serving(self) -> None:
        if not self.serving:
            raise NotServing("controller is not serving yet (recovering or standby); retry")

    # --- admin -----------------------------------------------------------------------------

    async def populate(
        self,
        nodes: Iterable[str],
        network_ref: str,
        project_id: str | None,
        security_groups: Iterable[str],
        count: int,
    ) -> dict[str, int]:
        self._check_serving()
        sgs = sg_key(security_groups)
        network = await self.neutron.network(network_ref, project_id)
        await self.neutron.check_security_groups(sgs)
        nodes = list(nodes)
        for node in nodes:  # all before any port is made: a refused populate changes nothing
            await self.liveness.require(node)
        created: dict[str, int] = {}
        for node in nodes:
            driver = await self.drivers.for_node(node)
            if not driver.pooled:
                created[node] = 0
                continue
            key = PoolKey(node, project_id or network.project_id, network.id)
            self._check_max(key, count)
            created[node] = await self.refiller.refill(key, sgs, driver, network, count)
        return created

    def _check_max(self, key: PoolKey, count: int) -> None:
        room = self.settings.max - self.pools.size(key)
        if self.settings.max and count > room:
            raise ValidationError(
                f"count: pool {tuple(key)} has room for {max(room, 0)} more ports (pool.max)"
            )

    async def free_nodes(self, nodes: Iterable[str]) -> int:
        wanted = set(nodes)
        freed = 0
        for key in [k for k in self.pools.pool_keys() if k.node in wanted]:
            freed += await self._free_key(key)
        return freed

    async def _free_key(self, key: PoolKey) -> int:
        vifs = self.pools.remove_key(key)
        driver = await self.drivers.for_node(key.node)
        self.metrics.pool_size.labels(*key).set(0)
        await driver.delete(key, vifs)
        log.info("pool.freed", key=key, ports=len(vifs))
        return len(vifs)

    async def delete_network_pools(self, network_id: str) -> int:
        freed = 0
        for key in [k for k in self.pools.pool_keys() if k.network_id == network_id]:
            freed += await self._free_key(key)
        self.neutron.forget_network(network_id)
        return freed

    async def remove_security_group(self, sg_id: str, network_id: str | None) -> int:
        moved = self.pools.strip_sg(sg_id, network_id)
        results = await asyncio.gather(
            *(self.neutron.update_port(v.port_id, security_group_ids=[]) for v in moved),
            return_exceptions=True,
        )
        self.neutron.forget_security_group(sg_id)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        log.info("pool.sg_removed", sg=sg_id, network=network_id, ports=len(moved))
        return len(moved)
