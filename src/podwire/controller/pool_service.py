"""The pools and in-use attachments of one leader term, and the term's background work.

Three parts work on this state, each with one job: ``PoolService`` (here) owns it, starts and
ends it with the term, and is what recovery, recycling, the mirror and the sweeper change it
through; ``vif_broker.VifBroker`` serves the VIF API's requests and releases;
``pool_admin.PoolAdmin`` runs the admin operations (populate, free, shrink, remove).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from podwire.config import PoolSettings
from podwire.controller.drivers import NodeDrivers
from podwire.controller.errors import NotServing
from podwire.controller.inuse import InUse, InUseStore
from podwire.controller.liveness import Liveness
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.neutron_ops import NeutronOps
from podwire.controller.pools import (
    MirrorView,
    PoolKey,
    Pools,
    PoolsView,
    SgKey,
    with_sgs,
)
from podwire.controller.refill import Refiller
from podwire.controller.sizing import Target
from podwire.log import get_logger
from podwire.schema.vif import Vif

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
    """What one term holds, shared by the service, the VIF broker and the admin; ``reset``
    renews it in place (each part keeps this one object)."""

    pools: Pools
    refiller: Refiller
    attachments: dict[tuple[str, str], InUse] = field(default_factory=dict)
    # Ports several in-use records hold (a restored or hand-edited etcd): port -> records.
    disputed: dict[str, set[tuple[str, str]]] = field(default_factory=dict)


class PoolService:
    """Owns the pools and the in-use attachments of one leader term.

    Recovery, recycling, the sweeper, the broker and the admin change them only through this
    class or ``term``'s pools, whose changes report every size, so the gauges follow.
    """

    def __init__(self, deps: PoolDeps) -> None:
        self._deps = deps
        self._pool_gauges: dict[PoolKey, Any] = {}
        self._mirror: MirrorView | None = None
        pools = self._new_pools()
        self.term = TermState(pools, Refiller(pools, deps.settings, deps.metrics, deps.liveness))
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

    def attachments_changed(self) -> None:
        self._deps.metrics.in_use.set(len(self.term.attachments))
        for listener in self.attachment_listeners:
            listener()

    @property
    def pools(self) -> PoolsView:
        return self.term.pools

    @property
    def attachments(self) -> Mapping[tuple[str, str], InUse]:
        return MappingProxyType(self.term.attachments)

    @property
    def neutron(self) -> NeutronOps:
        return self._deps.neutron

    @property
    def metrics(self) -> ControllerMetrics:
        return self._deps.metrics

    @property
    def liveness(self) -> Liveness:
        return self._deps.liveness

    def disputed(self, node: str) -> dict[str, list[str]]:
        """This node's ports held by several attachments: port -> attachments."""
        return {
            port_id: sorted(att for n, att in holders if n == node)
            for port_id, holders in self.term.disputed.items()
            if any(n == node for n, _ in holders)
        }

    def node_attachments(self, node: str) -> dict[str, Vif]:
        return {att: r.vif for (n, att), r in self.term.attachments.items() if n == node}

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
        self.term.disputed.clear()
        self.attachments_changed()

    async def drain(self) -> None:
        """Wait for background refills and port updates (tests and shutdown use it)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def check_serving(self) -> None:
        if not self.serving:
            raise NotServing("controller is not serving yet (recovering or standby); retry")

    async def adopt_in_use(self) -> set[str]:
        """Load the in-use attachments from etcd into this term; returns their port ids.

        A port held by several records (a restored or hand-edited etcd) is *disputed*: all
        its records are kept, none of their releases puts it back in a pool while another
        holds it, and the node's agent settles it (the attachment its checkpoint names keeps
        the port, it releases the others: ``GET .../vifs`` lists the disputes)."""
        records, _ = await self._deps.store.load()
        holders: dict[str, set[tuple[str, str]]] = {}
        for record in records:
            self.term.attachments[(record.node, record.attachment)] = record
            self.term.pools.adopt(record.key, record.vif)
            holders.setdefault(record.vif.port_id, set()).add((record.node, record.attachment))
        self.term.disputed = {port: held for port, held in holders.items() if len(held) > 1}
        for port_id, held in sorted(self.term.disputed.items()):
            log.warning(
                "controller.inuse.duplicate",
                port=port_id,
                records=sorted("/".join(h) for h in held),
            )
        self.attachments_changed()
        return {record.vif.port_id for record in records}

    def port_seen(self, key: PoolKey, vif: Vif) -> None:
        """The mirror shows a port of ours bound (anew or changed): see ``Pools.seen``."""
        if self.term.pools.seen(key, vif):
            log.debug("pool.port_current", key=key, port=vif.port_id)

    def port_gone(self, port_id: str, node: str) -> None:
        """The mirror no longer shows the port bound to ``node`` (deleted, unbound, moved):
        a free or recycling port of that node is forgotten; an in-use one stays its pod's
        until released (its agent learns of it from the same mirror)."""
        key = self.term.pools.pool_of(port_id) or self.term.pools.recyclable().get(port_id)
        if key is not None and key.node == node:
            self.term.pools.forget(port_id)
            log.info("pool.port_gone", key=key, port=port_id)

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
        in_use = sum(1 for record in self.term.attachments.values() if record.key == key)
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

    def recyclable(self) -> dict[str, PoolKey]:
        """Released ports waiting to be recycled, with the pool each goes back to."""
        return self.term.pools.recyclable()

    def forget(self, port_id: str) -> None:
        """Drop every trace of a port that Neutron no longer has."""
        self.term.pools.forget(port_id)

    def return_recycled(self, key: PoolKey, port_id: str, sgs: list[str]) -> None:
        """A recycled port back in its pool, carrying the SGs Neutron reports now."""
        vif = self.term.pools.vif(port_id)
        self.term.pools.finish_recycle(port_id)
        if vif is not None:
            self.term.pools.add(key, [with_sgs(vif, sgs)])
            self.term.refiller.sizer.returned(key, time.monotonic())

    async def delete_recycled(self, key: PoolKey, port_id: str) -> None:
        """Delete a released port (pool full or binding failed) through its node's driver."""
        vif = self.term.pools.vif(port_id)
        driver = await self._deps.drivers.for_node(key.node)
        if vif is not None:
            await driver.delete(key, [vif])
        self.term.pools.forget(port_id)

    async def dead_nodes(self) -> set[str]:
        """Nodes with pools or attachments here but no live agent."""
        alive = await self._deps.liveness.alive_nodes()
        known = {key.node for key in self.term.pools.pool_keys()}
        return (known | {node for node, _ in self.term.attachments}) - alive


def _log_refill_failure(refill: asyncio.Future[int]) -> None:
    if refill.cancelled():
        return
    exc = refill.exception()
    if exc is not None:
        log.warning("pool.refill_failed", error=str(exc))
