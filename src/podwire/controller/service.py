"""The pool service: what the VIF API and admin API do, on top of pools, refill and drivers.

Request path, in order of cost: an exact SG match costs no Neutron call; reusing another
group's port costs one port update; an empty pool makes the request wait (first come, first
served) for a refill. In-use attachments go to etcd before the VIF is returned, so a restarted
controller never hands the same port out twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from podwire.config import PoolSettings
from podwire.controller.drivers import NodeDrivers, PortDriver
from podwire.controller.errors import NotServing, PoolNotReady, SubnetFull
from podwire.controller.inuse import InUse, InUseStore
from podwire.controller.liveness import Liveness, no_agent
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.neutron_ops import NeutronOps
from podwire.controller.pools import (
    MirrorView,
    PoolKey,
    Pools,
    PoolsView,
    SgKey,
    Taken,
    Waiter,
    sg_key,
    with_sgs,
)
from podwire.controller.refill import Refiller
from podwire.controller.sizing import Target
from podwire.errors import PodwireError, ValidationError
from podwire.log import get_logger
from podwire.neutron.client import NeutronAddressesExhausted
from podwire.neutron.vifs import NetworkInfo
from podwire.schema.vif import PodRef, Vif, VifRequest

log = get_logger(__name__)

# How long a request whose pool holds only ports the mirror does not show yet waits for them
# once its refill is done: the forwarder writes within milliseconds while it runs.
UNSEEN_WAIT = 5.0


@dataclass(frozen=True)
class PoolSnapshot:
    """One pool as the admin API shows it: a copy, so a reader never holds live state."""

    key: PoolKey
    size: int
    in_use: int
    recyclable: int
    last_refill: float | None
    waiting: int
    groups: list[tuple[SgKey, list[str]]]
    target: Target
    unseen: list[str]  # counted in size: bound by Neutron, not in the forwarder's mirror yet


class PoolService:
    """Owns the pools and the in-use attachments of one leader term.

    Recovery, recycling, the sweeper and the admin API change them only through the methods
    below, so the gauges follow every change and no caller can leave the two out of step.
    """

    def __init__(
        self,
        settings: PoolSettings,
        neutron: NeutronOps,
        drivers: NodeDrivers,
        store: InUseStore,
        metrics: ControllerMetrics,
        liveness: Liveness,
    ) -> None:
        self._settings = settings
        self._liveness = liveness
        self._neutron = neutron
        self._drivers = drivers
        self._store = store
        self._metrics = metrics
        self._pool_gauges: dict[PoolKey, Any] = {}
        self._mirror: MirrorView | None = None
        self._pools = self._new_pools()
        self._refiller = Refiller(self._pools, settings, metrics, liveness)
        self._attachments: dict[tuple[str, str], InUse] = {}
        # One lock per attachment with requests or releases under way: they are served in
        # arrival order (asyncio's locks are first come, first served).
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._lock_users: dict[tuple[str, str], int] = {}
        # Ports several in-use records hold (a restored or hand-edited etcd): port -> records.
        self._disputed: dict[str, set[tuple[str, str]]] = {}
        self._background: set[asyncio.Future[Any]] = set()
        self._group: asyncio.TaskGroup | None = None
        self.serving = False
        self.released = asyncio.Event()  # set by every release: the recycler's wake-up

    def _new_pools(self) -> Pools:
        return Pools(self._pool_size_changed, self._mirror)

    def _pool_size_changed(self, key: PoolKey, size: int) -> None:
        gauge = self._pool_gauges.get(key)
        if gauge is None:  # labels() costs more than the rest of a pool hit's bookkeeping
            gauge = self._pool_gauges[key] = self._metrics.pool_size.labels(*key)
        gauge.set(size)

    def _attachments_changed(self) -> None:
        self._metrics.in_use.set(len(self._attachments))

    # --- read-only views for tests and operators ----------------------------------------

    @property
    def pools(self) -> PoolsView:
        return self._pools

    @property
    def attachments(self) -> Mapping[tuple[str, str], InUse]:
        return MappingProxyType(self._attachments)

    @property
    def neutron(self) -> NeutronOps:
        return self._neutron

    @property
    def metrics(self) -> ControllerMetrics:
        return self._metrics

    @property
    def liveness(self) -> Liveness:
        return self._liveness

    # --- VIF API ---------------------------------------------------------------------------

    async def request(self, node: str, req: VifRequest) -> Vif:
        """The attachment's VIF. Requests and releases of one attachment are served one at a
        time in arrival order, so a release that arrives after a request undoes it, and one
        that arrives before it leaves the request to hold the port."""
        self._check_serving()
        ident = (node, req.attachment)
        known = self._attachments.get(ident)
        if known is not None and not _replacing(req, known):
            return known.vif
        async with self._serialised(ident):
            self._check_serving()
            known = self._attachments.get(ident)
            if known is not None and not _replacing(req, known):
                return known.vif
            return await self._request(node, req)

    @contextlib.asynccontextmanager
    async def _serialised(self, ident: tuple[str, str]) -> AsyncIterator[None]:
        lock = self._locks.setdefault(ident, asyncio.Lock())
        self._lock_users[ident] = self._lock_users.get(ident, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._lock_users[ident] -= 1
            if not self._lock_users[ident]:
                del self._lock_users[ident], self._locks[ident]

    async def _request(self, node: str, req: VifRequest) -> Vif:
        network = await self._neutron.network(req.network, req.project_id)
        project = req.project_id or network.project_id
        await self._neutron.check_security_groups(req.security_groups, project)
        key = PoolKey(node, project, network.id)
        driver = await self._drivers.for_node(node)
        if driver.pooled:
            vif = await self._from_pool(key, req.security_groups, driver, network)
        else:
            vif = await self._create_one(key, req.security_groups, driver, network)
        record = InUse(node, req.attachment, key, vif)
        try:
            await self._store.put(record)  # over a vanished port's record, when it replaces one
        except BaseException:
            await self._undo_take(driver, key, vif)
            raise
        vanished = self._attachments.get((node, req.attachment))
        self._attachments[(node, req.attachment)] = record
        self._attachments_changed()
        if vanished is not None:
            await self._vanished(driver, vanished)
        if self._settings.port_debug:
            self._spawn(self._name_port(vif.port_id, req))
        return vif

    async def _vanished(self, driver: PortDriver, record: InUse) -> None:
        """The agent could not wire this port (its desired key went away): recycled, the
        recycler drops it if Neutron no longer has it bound and pools it again if it does."""
        log.info("pool.port_vanished", node=record.node, port=record.vif.port_id)
        if driver.pooled:
            self._pools.release(record.key, record.vif.port_id)
            self.released.set()
        else:
            self._pools.forget(record.vif.port_id)
            with contextlib.suppress(PodwireError):
                await driver.delete(record.key, [record.vif])

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
        self._refiller.sizer.request(key, time.monotonic())
        taken = self._pools.take(key, wanted)
        if taken is None:
            self._metrics.misses.inc()
            taken = await self._wait_for_port(key, wanted, driver, network)
        elif taken.sg_update:
            self._metrics.reuses.inc()
        else:
            self._metrics.hits.inc()
        if self._pools.size(key) < self._refiller.target(key) and not self._refiller.busy(key):
            self._spawn(self._background_refill(key, wanted, driver, network))
        return await self._apply_sgs(taken)

    async def _wait_for_port(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> Taken:
        if network.physnet is not None:  # a miss costs Neutron calls anyway; this is one read
            name = f"{network.name} ({network.id})" if network.name else network.id
            await self._liveness.require_physnet(key.node, name, network.physnet)
        got: asyncio.Future[Taken] = asyncio.get_running_loop().create_future()
        waiter = Waiter(wanted, got.set_result)
        self._pools.wait(key, waiter)
        refill = asyncio.ensure_future(self._refiller.refill(key, wanted, driver, network))
        either: set[asyncio.Future[Any]] = {refill, got}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            waiter.cancelled = True
            self._keep(refill)
            raise
        if got.done():
            # Served (a recycled port, another refill's batch): this refill goes on for the
            # requests behind, but this one does not wait for the rest of it.
            self._keep(refill)
            return got.result()
        try:
            refill.result()
        except PodwireError as exc:
            if not got.done():
                waiter.cancelled = True
                failure = _refill_failure(key, network, exc)
                if failure is exc:
                    raise
                raise failure from exc
        except BaseException:
            waiter.cancelled = True
            raise
        if not got.done() and self._pools.unseen(key):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(UNSEEN_WAIT):
                    await asyncio.shield(got)
        if not got.done():
            waiter.cancelled = True
            raise PoolNotReady(self._not_ready(key))
        return got.result()

    def _not_ready(self, key: PoolKey) -> str:
        if self._liveness.noted_dead(key.node):
            return f"pool {tuple(key)} is empty: {no_agent(key.node)}"
        unseen = len(self._pools.unseen(key))
        if unseen:
            return (
                f"pool {tuple(key)}: the bindings of its {unseen} new ports have not reached"
                f" etcd after {UNSEEN_WAIT:.0f} s (is the ml2 forwarder running?); retry"
            )
        return f"pool {tuple(key)} has no port ready yet; retry"

    async def _apply_sgs(self, taken: Taken) -> Vif:
        if not taken.sg_update:
            return taken.vif
        try:
            await self._neutron.update_port(
                taken.vif.port_id, security_group_ids=list(taken.wanted)
            )
        except BaseException:
            self._pools.add(taken.key, [taken.vif], oldest=True)
            raise
        vif = with_sgs(taken.vif, taken.wanted)
        self._pools.adopt(taken.key, vif)
        return vif

    async def _undo_take(self, driver: PortDriver, key: PoolKey, vif: Vif) -> None:
        if driver.pooled:
            self._pools.add(key, [vif], oldest=True)
            return
        with contextlib.suppress(PodwireError):
            await driver.delete(key, [vif])

    async def _name_port(self, port_id: str, req: VifRequest) -> None:
        """Debug naming only: a failure costs a name, never the pod's port."""
        try:
            pod = req.pod or PodRef("", "")
            await self._neutron.update_port(port_id, name=pod.name, device_id=pod.uid)
        except PodwireError as exc:
            log.warning("pool.port_naming_failed", port=port_id, error=str(exc))

    async def release(self, node: str, attachment: str) -> None:
        self._check_serving()
        ident = (node, attachment)
        if ident not in self._attachments and ident not in self._locks:
            return
        async with self._serialised(ident):
            record = await self._drop_record(ident)
            if record is None:
                return
            driver = await self._drivers.for_node(node)
            if driver.pooled:
                self._pools.release(record.key, record.vif.port_id)
                self.released.set()
            else:
                self._pools.forget(record.vif.port_id)
                await driver.delete(record.key, [record.vif])

    async def _drop_record(self, ident: tuple[str, str]) -> InUse | None:
        """Delete an attachment's in-use record (under its lock); returns it unless there was
        none or another record still holds its port."""
        record = self._attachments.get(ident)
        if record is None:
            return None
        await self._store.delete(*ident)
        del self._attachments[ident]
        self._attachments_changed()
        return None if self._still_held(ident, record) else record

    async def remove_node(self, node: str, reason: str) -> list[str]:
        """Everything a node held, as when it is deleted from the cluster: its attachments'
        ports are deleted in Neutron (its pods went with it, so their addresses are free at
        once), then their records go and its pools are freed. Returns the in-use ports
        deleted. A failed delete leaves the records, so the removal can simply be repeated
        (deleting a port already gone is no error). ``reason``: ``removed`` (an operator) or
        ``dead`` (no agent for ``pool.node_release_after``)."""
        self._check_serving()
        held = {i: r for i, r in self._attachments.items() if i[0] == node}
        doomed: dict[PoolKey, list[Vif]] = {}
        for ident, record in held.items():
            if not self._held_elsewhere(ident, record):
                doomed.setdefault(record.key, []).append(record.vif)
        driver = await self._drivers.for_node(node)
        for key, vifs in doomed.items():
            await driver.delete(key, vifs)
        for ident in held:
            async with self._serialised(ident):
                dropped = await self._drop_record(ident)
            if dropped is not None:
                self._pools.forget(dropped.vif.port_id)
        freed = await self.remove_nodes([node])
        released = sorted(v.port_id for vifs in doomed.values() for v in vifs)
        self._metrics.nodes_released.labels(reason).inc()
        log.warning("controller.node_released", node=node, reason=reason, pool_ports=freed,
                    ports=released)  # fmt: skip
        return released

    def _held_elsewhere(self, ident: tuple[str, str], record: InUse) -> bool:
        """Whether another node's record holds this port too (a dispute): it is not deleted."""
        holders = self._disputed.get(record.vif.port_id, set())
        return any(other[0] != ident[0] for other in holders)

    def _still_held(self, ident: tuple[str, str], record: InUse) -> bool:
        """Whether another record still holds the released record's port (a dispute): then
        the port stays with it and goes back to no pool."""
        holders = self._disputed.get(record.vif.port_id)
        if holders is None:
            return False
        holders.discard(ident)
        log.warning(
            "controller.inuse.duplicate_dropped",
            port=record.vif.port_id,
            dropped=f"{ident[0]}/{ident[1]}",
            kept=sorted(f"{n}/{a}" for n, a in holders),
        )
        if len(holders) <= 1:
            del self._disputed[record.vif.port_id]
        return bool(holders)

    def disputed(self, node: str) -> dict[str, list[str]]:
        """This node's ports held by several attachments: port -> attachments."""
        return {
            port_id: sorted(att for n, att in holders if n == node)
            for port_id, holders in self._disputed.items()
            if any(n == node for n, _ in holders)
        }

    def node_attachments(self, node: str) -> dict[str, Vif]:
        return {att: r.vif for (n, att), r in self._attachments.items() if n == node}

    # --- background work -------------------------------------------------------------------

    def _keep(self, refill: asyncio.Future[int]) -> None:
        """A refill no request awaits any more: drain() and the term's end still wait for
        it, and its failure is logged, not lost."""
        self._background.add(refill)
        refill.add_done_callback(self._background.discard)
        refill.add_done_callback(_log_refill_failure)

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

    def reset(self, mirror: MirrorView | None = None) -> None:
        """Forget a past term's pools and attachments; the next term recovers them afresh.

        Another controller may have led meanwhile and handed out what this one still holds
        in memory, so nothing of the old term is trusted. ``mirror``: the new term's view of
        the forwarder's mirror, which decides in what state a port is handed out.
        """
        self._mirror = mirror
        self._pools = self._new_pools()
        self._refiller = Refiller(self._pools, self._settings, self._metrics, self._liveness)
        self._attachments.clear()
        self._disputed.clear()
        self._attachments_changed()

    async def _background_refill(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> None:
        try:
            await self._refiller.refill(key, wanted, driver, network)
        except PodwireError as exc:
            log.warning("pool.refill_failed", key=key, error=str(exc))

    async def drain(self) -> None:
        """Wait for background refills and port updates (tests and shutdown use it)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def _check_serving(self) -> None:
        if not self.serving:
            raise NotServing("controller is not serving yet (recovering or standby); retry")

    # --- state API: recovery, recycling, the sweeper and the admin API --------------------

    async def adopt_in_use(self) -> set[str]:
        """Load the in-use attachments from etcd into this term; returns their port ids.

        A port held by several records (a restored or hand-edited etcd) is *disputed*: all
        its records are kept, none of their releases puts it back in a pool while another
        holds it, and the node's agent settles it (the attachment its checkpoint names keeps
        the port, it releases the others: ``GET .../vifs`` lists the disputes)."""
        records, _ = await self._store.load()
        holders: dict[str, set[tuple[str, str]]] = {}
        for record in records:
            self._attachments[(record.node, record.attachment)] = record
            self._pools.adopt(record.key, record.vif)
            holders.setdefault(record.vif.port_id, set()).add((record.node, record.attachment))
        self._disputed = {port: held for port, held in holders.items() if len(held) > 1}
        for port_id, held in sorted(self._disputed.items()):
            log.warning(
                "controller.inuse.duplicate",
                port=port_id,
                records=sorted("/".join(h) for h in held),
            )
        self._attachments_changed()
        return {record.vif.port_id for record in records}

    def port_seen(self, key: PoolKey, vif: Vif) -> None:
        """The mirror shows a port of ours bound (anew or changed): see ``Pools.seen``."""
        if self._pools.seen(key, vif):
            log.debug("pool.port_current", key=key, port=vif.port_id)

    def port_gone(self, port_id: str, node: str) -> None:
        """The mirror no longer shows the port bound to ``node`` (deleted, unbound, moved):
        a free or recycling port of that node is forgotten; an in-use one stays its pod's
        until released (its agent learns of it from the same mirror)."""
        key = self._pools.pool_of(port_id) or self._pools.recyclable().get(port_id)
        if key is not None and key.node == node:
            self._pools.forget(port_id)
            log.info("pool.port_gone", key=key, port=port_id)

    def add_free(self, key: PoolKey, vifs: list[Vif]) -> None:
        """Pool ready ports (found by recovery); waiting requests get them first."""
        self._pools.add(key, vifs)

    def drop_free(self, port_id: str) -> PoolKey | None:
        """Forget a pooled free port Neutron no longer has; returns its pool, None if the
        port is not free in a pool (in use, recycling or unknown: left alone)."""
        key = self._pools.pool_of(port_id)
        if key is not None:
            self._pools.forget(port_id)
        return key

    def knows(self, port_id: str) -> bool:
        """Whether the port is pooled, in use or recycling here (so not a leftover)."""
        return self._pools.known(port_id)

    def pool_keys(self) -> list[PoolKey]:
        return self._pools.pool_keys()

    def pool_size(self, key: PoolKey) -> int:
        return self._pools.size(key)

    def snapshot(self, key: PoolKey) -> PoolSnapshot:
        in_use = sum(1 for record in self._attachments.values() if record.key == key)
        return PoolSnapshot(
            key=key,
            size=self._pools.size(key),
            in_use=in_use,
            recyclable=sum(1 for k in self._pools.recyclable().values() if k == key),
            last_refill=self._refiller.last_refill.get(key),
            waiting=self._pools.waiting(key),
            groups=self._pools.groups(key),
            target=self._refiller.sizer.target(key, time.monotonic()),
            unseen=self._pools.unseen(key),
        )

    def recyclable(self) -> dict[str, PoolKey]:
        """Released ports waiting to be recycled, with the pool each goes back to."""
        return self._pools.recyclable()

    def forget(self, port_id: str) -> None:
        """Drop every trace of a port that Neutron no longer has."""
        self._pools.forget(port_id)

    def return_recycled(self, key: PoolKey, port_id: str, sgs: list[str]) -> None:
        """A recycled port back in its pool, carrying the SGs Neutron reports now."""
        vif = self._pools.vif(port_id)
        self._pools.finish_recycle(port_id)
        if vif is not None:
            self._pools.add(key, [with_sgs(vif, sgs)])
            self._refiller.sizer.returned(key, time.monotonic())

    async def delete_recycled(self, key: PoolKey, port_id: str) -> None:
        """Delete a released port (pool full or binding failed) through its node's driver."""
        vif = self._pools.vif(port_id)
        driver = await self._drivers.for_node(key.node)
        if vif is not None:
            await driver.delete(key, [vif])
        self._pools.forget(port_id)

    async def dead_nodes(self) -> set[str]:
        """Nodes with pools or attachments here but no live agent."""
        alive = await self._liveness.alive_nodes()
        known = {key.node for key in self._pools.pool_keys()}
        return (known | {node for node, _ in self._attachments}) - alive

    async def remove_nodes(self, nodes: Iterable[str]) -> int:
        """Free the pools of removed nodes and forget their drivers; returns ports freed."""
        nodes = set(nodes)
        freed = await self.free_nodes(nodes)
        for node in nodes:
            self._drivers.forget(node)
        return freed

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
        network = await self._neutron.network(network_ref, project_id)
        await self._neutron.check_security_groups(sgs, project_id or network.project_id)
        nodes = list(nodes)
        for node in nodes:  # all before any port is made: a refused populate changes nothing
            await self._liveness.require(node)
        created: dict[str, int] = {}
        for node in nodes:
            driver = await self._drivers.for_node(node)
            if not driver.pooled:
                created[node] = 0
                continue
            key = PoolKey(node, project_id or network.project_id, network.id)
            self._check_max(key, count)
            created[node] = await self._refiller.refill(key, sgs, driver, network, count)
        return created

    def _check_max(self, key: PoolKey, count: int) -> None:
        room = self._settings.max - self._pools.size(key)
        if self._settings.max and count > room:
            raise ValidationError(
                f"count: pool {tuple(key)} has room for {max(room, 0)} more ports (pool.max)"
            )

    async def shrink_idle(self) -> int:
        """Delete free ports above the target of pools idle for ``pool.idle_ttl``; returns
        how many were deleted."""
        now = time.monotonic()
        shrinking = []
        for key in self._pools.pool_keys():
            surplus = self._refiller.sizer.surplus(key, self._pools.size(key), now)
            if surplus > 0 and not self._refiller.busy(key):
                shrinking.append(self._shrink(key, self._pools.take_surplus(key, surplus)))
        # All pools at once: a churn that ends on many nodes leaves each its surplus together.
        results = await asyncio.gather(*shrinking, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(r for r in results if isinstance(r, int))

    async def _shrink(self, key: PoolKey, vifs: list[Vif]) -> int:
        driver = await self._drivers.for_node(key.node)
        try:
            await driver.delete(key, vifs)
        except BaseException:
            self._pools.add(key, vifs, oldest=True)  # still in Neutron: keep them pooled
            raise
        log.info("pool.shrunk", key=key, deleted=len(vifs), size=self._pools.size(key))
        return len(vifs)

    async def free_nodes(self, nodes: Iterable[str]) -> int:
        wanted = set(nodes)
        freed = 0
        for key in [k for k in self._pools.pool_keys() if k.node in wanted]:
            freed += await self._free_key(key)
        return freed

    async def _free_key(self, key: PoolKey) -> int:
        vifs = self._pools.remove_key(key)
        driver = await self._drivers.for_node(key.node)
        await driver.delete(key, vifs)
        log.info("pool.freed", key=key, ports=len(vifs))
        return len(vifs)

    async def delete_network_pools(self, network_id: str) -> int:
        freed = 0
        for key in [k for k in self._pools.pool_keys() if k.network_id == network_id]:
            freed += await self._free_key(key)
        self._neutron.forget_network(network_id)
        return freed

    async def remove_security_group(self, sg_id: str, network_id: str | None) -> int:
        moved = self._pools.strip_sg(sg_id, network_id)
        results = await asyncio.gather(
            *(self._neutron.update_port(v.port_id, security_group_ids=[]) for v in moved),
            return_exceptions=True,
        )
        self._neutron.forget_security_group(sg_id)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        log.info("pool.sg_removed", sg=sg_id, network=network_id, ports=len(moved))
        return len(moved)


def _refill_failure(key: PoolKey, network: NetworkInfo, exc: PodwireError) -> PodwireError:
    """What a request whose pool could not be filled is told: retry only when it may help."""
    if isinstance(exc, NeutronAddressesExhausted):
        cidrs = ", ".join(sorted(s.cidr for s in network.subnets.values()))
        return SubnetFull(
            f"network {network.name or network.id} ({network.id}) has no free address in its"
            f" subnets ({cidrs}): free addresses or add a subnet in Neutron ({exc})"
        )
    if not exc.retryable:
        return exc
    return PoolNotReady(f"pool {tuple(key)} could not be filled: {exc}")


def _replacing(req: VifRequest, known: InUse) -> bool:
    """Whether the request asks for another port than the one the attachment holds (it
    vanished before its node wired it)."""
    return req.replaces is not None and req.replaces == known.vif.port_id


def _log_refill_failure(refill: asyncio.Future[int]) -> None:
    if refill.cancelled():
        return
    exc = refill.exception()
    if exc is not None:
        log.warning("pool.refill_failed", error=str(exc))
