"""One leader term's state, started and ended with the term, and the term's background work.

A term holds three owners, each the only writer of its own state: ``pools.Pools`` (free and
recycling ports), ``attachments.Attachments`` (in-use records) and ``refill.Refiller``
(Neutron creates under way). ``PoolService`` (here) renews them when a term begins, loads what
recovery finds, and runs the term's background tasks. The jobs on that state live beside it:
``vif_broker.VifBroker`` serves the VIF API's requests and releases, ``pool_admin.PoolAdmin``
the admin operations, ``recycler`` the released ports, ``follow`` the forwarder's mirror,
``sweeper`` the dead nodes and leftovers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from podwire.config import PoolSettings
from podwire.controller.attachments import Attachments
from podwire.controller.drivers import NodeDrivers
from podwire.controller.errors import NotServing
from podwire.controller.inuse import InUseStore
from podwire.controller.liveness import Liveness
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.neutron_ops import NeutronOps
from podwire.controller.pools import MirrorView, Pools, PoolsView
from podwire.controller.refill import Refiller
from podwire.controller.sizing import Target
from podwire.log import get_logger
from podwire.schema.inuse import InUse, PoolKey, SgKey
from podwire.schema.vif import Vif

log = get_logger(__name__)


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


@dataclass(frozen=True)
class PoolDeps:
    """What the service, the VIF broker and the admin of a controller work with."""

    settings: PoolSettings
    neutron: NeutronOps
    drivers: NodeDrivers
    store: InUseStore
    metrics: ControllerMetrics
    liveness: Liveness


@dataclass
class TermState:
    """What one term holds, shared by the jobs the module's docstring names; ``reset`` renews
    it in place (each part keeps this one object)."""

    pools: Pools
    refiller: Refiller
    attachments: Attachments


class PoolService:
    """Begins and ends a leader term's state; its owners report every change, so the
    gauges follow."""

    def __init__(self, deps: PoolDeps) -> None:
        self._deps = deps
        self._pool_gauges: dict[PoolKey, Any] = {}
        self._mirror: MirrorView | None = None
        pools = self._new_pools()
        refiller = Refiller(pools, deps.settings, deps.metrics, deps.liveness)
        self.term = TermState(pools, refiller, Attachments(self._attachments_changed))
        self._background: set[asyncio.Future[Any]] = set()
        self._group: asyncio.TaskGroup | None = None
        self.serving = False
        self.released = asyncio.Event()  # set by every release: the recycler's wake-up
        # Called whenever an attachment's record came or went (the pod annotations' wake-up).
        self.attachment_listeners: list[Callable[[], None]] = []

    def _new_pools(self) -> Pools:
        return Pools(self._pool_size_changed, self._mirror)

    def _pool_size_changed(self, key: PoolKey, size: int) -> None:
        gauge = self._pool_gauges.get(key)
        if gauge is None:  # labels() costs more than the rest of a pool hit's bookkeeping
            gauge = self._pool_gauges[key] = self._deps.metrics.pool_size.labels(*key)
        gauge.set(size)

    def _attachments_changed(self, count: int) -> None:
        self._deps.metrics.in_use.set(count)
        for listener in self.attachment_listeners:
            listener()

    @property
    def pools(self) -> PoolsView:
        return self.term.pools

    @property
    def attachments(self) -> Mapping[tuple[str, str], InUse]:
        return self.term.attachments.view

    @property
    def neutron(self) -> NeutronOps:
        return self._deps.neutron

    @property
    def drivers(self) -> NodeDrivers:
        return self._deps.drivers

    @property
    def metrics(self) -> ControllerMetrics:
        return self._deps.metrics

    @property
    def liveness(self) -> Liveness:
        return self._deps.liveness

    def keep(self, refill: asyncio.Future[int]) -> None:
        """A refill no request awaits any more: drain() and the term's end still wait for
        it, and its failure is logged, not lost."""
        self._background.add(refill)
        refill.add_done_callback(self._background.discard)
        refill.add_done_callback(_log_refill_failure)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
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
        self.term.pools = self._new_pools()
        self.term.refiller = Refiller(
            self.term.pools, self._deps.settings, self._deps.metrics, self._deps.liveness
        )
        self.term.attachments.clear()

    async def drain(self) -> None:
        """Wait for background refills and port updates (tests and shutdown use it)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def check_serving(self) -> None:
        if not self.serving:
            raise NotServing("controller is not serving yet (recovering or standby); retry")

    async def adopt_in_use(self) -> set[str]:
        """Load the in-use attachments from etcd into this term; returns their port ids."""
        records, _ = await self._deps.store.load()
        for record in records:
            self.term.pools.adopt(record.key, record.vif)
        self.term.attachments.load(records)
        return {record.vif.port_id for record in records}

    def add_free(self, key: PoolKey, vifs: list[Vif]) -> None:
        """Pool ready ports (found by recovery); waiting requests get them first."""
        self.term.pools.add(key, vifs)

    def drop_free(self, port_id: str) -> PoolKey | None:
        """Forget a pooled free port Neutron no longer has; returns its pool, None if the
        port is not free in a pool (in use, recycling or unknown: left alone)."""
        key = self.term.pools.pool_of(port_id)
        if key is not None:
            self.term.pools.forget(port_id)
        return key

    def knows(self, port_id: str) -> bool:
        """Whether the port is pooled, in use or recycling here (so not a leftover)."""
        return self.term.pools.known(port_id)

    def pool_keys(self) -> list[PoolKey]:
        return self.term.pools.pool_keys()

    def pool_size(self, key: PoolKey) -> int:
        return self.term.pools.size(key)

    def snapshot(self, key: PoolKey) -> PoolSnapshot:
        in_use = sum(1 for record in self.attachments.values() if record.key == key)
        return PoolSnapshot(
            key=key,
            size=self.term.pools.size(key),
            in_use=in_use,
            recyclable=sum(1 for k in self.term.pools.recyclable().values() if k == key),
            last_refill=self.term.refiller.last_refill.get(key),
            waiting=self.term.pools.waiting(key),
            groups=self.term.pools.groups(key),
            target=self.term.refiller.sizer.target(key, time.monotonic()),
            unseen=self.term.pools.unseen(key),
        )


def _log_refill_failure(refill: asyncio.Future[int]) -> None:
    if refill.cancelled():
        return
    exc = refill.exception()
    if exc is not None:
        log.warning("pool.refill_failed", error=str(exc))
