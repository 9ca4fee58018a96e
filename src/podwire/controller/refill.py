"""Filling pools: one refill at a time per pool, bulk creates in batches, bounded globally.

Neutron creates ports slowly (~100+ ms each), so a refill asks for a whole batch per bulk
request and several batches at once, but never more than ``bulk_concurrency`` bulk requests
in flight across all pools, so a burst on many nodes cannot overload Neutron.

The top-up a request starts waits until its pool has seen no request, release or returned
port for ``pool.refill_pause`` while the pool holds more than its floor (``pool.min``, or
what its sustained drain takes while a refill lands): a sudden burst the pool covers is
served without Neutron working at the same time, and when the burst's pods are deleted
meanwhile, their recycled ports offset the drain and no port is created at all. Measured
under containerd on one 2-core machine, an eager top-up made a 30-pod burst take 1.7x as
long (Neutron's bulk creates took the CPU the runtime's sandboxes needed). Below the floor,
and for a request that finds the pool empty, it refills at once.

A refill that finds the network's subnets full fails every request waiting for that pool at
once (not each in turn after a refill of its own), and the network's automatic refills are
not tried again for ``EXHAUSTED_HOLD`` seconds: addresses come back only when someone frees
them, so asking Neutron again at once only costs calls.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from podwire.config import PoolSettings
from podwire.controller.drivers import PortDriver
from podwire.controller.errors import BindingFailed, PoolNotReady
from podwire.controller.liveness import Liveness
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.pools import Pools
from podwire.controller.sizing import PoolSizer, step_toward
from podwire.log import get_logger
from podwire.neutron.client import NeutronAddressesExhausted
from podwire.neutron.vifs import NetworkInfo
from podwire.schema.inuse import PoolKey, SgKey
from podwire.schema.vif import Vif

log = get_logger(__name__)

# Seconds a network whose subnets were found full gets no automatic refill (its requests are
# refused at once meanwhile); populate, an operator's word, still asks Neutron.
EXHAUSTED_HOLD = 5.0


def refill_count(size: int, waiting: int, settings: PoolSettings, target: int | None = None) -> int:
    """How many ports to create so the pool reaches its target (``min`` when fixed) after
    serving who is waiting."""
    target = (settings.min if target is None else target) + waiting
    if size >= target:
        return 0
    count = max(settings.batch, target - size)
    if settings.max:
        count = min(count, max(settings.max - size, waiting))
    return count


def batches(count: int, batch: int) -> list[int]:
    return [min(batch, count - start) for start in range(0, count, batch)]


class Refiller:
    def __init__(
        self, pools: Pools, settings: PoolSettings, metrics: ControllerMetrics, liveness: Liveness
    ) -> None:
        self._pools = pools
        self._liveness = liveness
        self._settings = settings
        self._metrics = metrics
        self._locks: defaultdict[PoolKey, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._gate = asyncio.Semaphore(settings.bulk_concurrency)
        self._pausing: set[PoolKey] = set()  # pools whose top-up waits for a pause
        self.last_refill: dict[PoolKey, float] = {}  # unix time of the last finished refill
        # network -> (monotonic time, Neutron's refusal) of the last refill that found it full
        self._exhausted: dict[str, tuple[float, NeutronAddressesExhausted]] = {}
        self.sizer: PoolSizer[PoolKey] = PoolSizer(settings)

    def target(self, key: PoolKey) -> int:
        return self.sizer.target(key, time.monotonic()).size

    def _refill_goal(self, key: PoolKey) -> int:
        """The size this refill aims at (before the waiters): the target, approached by
        doubling; never below min."""
        size = self._pools.size(key)
        goal = step_toward(self.target(key), size, self._settings.batch)
        return max(goal, self._settings.min)

    def busy(self, key: PoolKey) -> bool:
        return self._locks[key].locked()

    def short(self, key: PoolKey) -> bool:
        return self._pools.size(key) < self.target(key) and not self.busy(key)

    def _urgent(self, key: PoolKey) -> bool:
        """No pause configured, or the pool is below its floor: the larger of ``pool.min``
        and what its sustained drain takes while a refill lands."""
        if not self._settings.refill_pause:
            return True
        floor = max(self._settings.min, self.sizer.reserve(key, time.monotonic()))
        return self._pools.size(key) < floor

    async def top_up(
        self, key: PoolKey, sgs: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> int:
        """After a request: refill the pool to its target, at once when it is below its
        floor, else once its requests pause (one waiting top-up per pool)."""
        if not self.short(key):
            return 0
        if not self._urgent(key):
            if key in self._pausing:
                return 0
            self._pausing.add(key)
            try:
                await self._pause(key)
            finally:
                self._pausing.discard(key)
            if not self.short(key):
                return 0
        return await self.refill(key, sgs, driver, network)

    async def _pause(self, key: PoolKey) -> None:
        pause = self._settings.refill_pause
        while not self._urgent(key):
            quiet = self.sizer.quiet_for(key, time.monotonic())
            if quiet >= pause:
                return
            await asyncio.sleep(pause - quiet)

    async def refill(
        self,
        key: PoolKey,
        sgs: SgKey,
        driver: PortDriver,
        network: NetworkInfo,
        count: int | None = None,
    ) -> int:
        """Top the pool up (or add exactly ``count``); returns how many ports were pooled.

        A top-up skips a node without a live agent (its ports could not bind); an explicit
        ``count`` (populate) is checked by the caller, which refuses such a node.
        """
        lock = self._locks[key]
        try:
            async with asyncio.timeout(self._settings.populate_timeout):
                await lock.acquire()
        except TimeoutError as exc:
            raise PoolNotReady(f"pool {key} is still being filled; retry later") from exc
        try:
            if count is None:
                if not await self._liveness.may_refill(key.node):
                    return 0
                self._check_exhausted(network)
                count = refill_count(
                    self._pools.size(key),
                    self._pools.waiting(key),
                    self._settings,
                    self._refill_goal(key),
                )
            if count <= 0:
                return 0
            return await self._create(key, sgs, driver, network, count)
        finally:
            lock.release()

    async def _create(
        self, key: PoolKey, sgs: SgKey, driver: PortDriver, network: NetworkInfo, count: int
    ) -> int:
        started = time.monotonic()
        results = await asyncio.gather(
            *(
                self._one_batch(key, sgs, driver, network, n)
                for n in batches(count, self._settings.batch)
            ),
            return_exceptions=True,
        )
        created = sum(len(r) for r in results if isinstance(r, list))
        self._metrics.refill_seconds.observe(time.monotonic() - started)
        self.last_refill[key] = time.time()
        log.info("pool.refilled", key=key, created=created, wanted=count)
        failures = [r for r in results if isinstance(r, BaseException)]
        full = next((f for f in failures if isinstance(f, NeutronAddressesExhausted)), None)
        if full is not None:
            self._note_exhausted(key, network, full)
        elif created:
            self._exhausted.pop(network.id, None)  # addresses again (a populate found them)
        # A batch none of whose ports bound is a failure only when no batch made any.
        others = [f for f in failures if not isinstance(f, BindingFailed)]
        if others or (failures and not created):
            raise (others or failures)[0]
        return created

    def _note_exhausted(
        self, key: PoolKey, network: NetworkInfo, full: NeutronAddressesExhausted
    ) -> None:
        """The subnets are full: the pool's waiting requests are told now, each its own
        error, and the network's refills rest (``EXHAUSTED_HOLD``)."""
        self._exhausted[network.id] = (time.monotonic(), full)
        failed = self._pools.fail_waiters(
            key, lambda: NeutronAddressesExhausted(str(full), full.status)
        )
        log.warning("pool.subnets_full", key=key, network=network.id, waiting_failed=failed)

    def _check_exhausted(self, network: NetworkInfo) -> None:
        """Refuses an automatic refill of a network found full less than EXHAUSTED_HOLD ago."""
        noted = self._exhausted.get(network.id)
        if noted is None:
            return
        age = time.monotonic() - noted[0]
        if age >= EXHAUSTED_HOLD:
            del self._exhausted[network.id]
            return
        raise NeutronAddressesExhausted(
            f"{noted[1]} (found {age:.1f} s ago; Neutron is asked again after"
            f" {EXHAUSTED_HOLD:.0f} s)",
            noted[1].status,
        )

    async def _one_batch(
        self, key: PoolKey, sgs: SgKey, driver: PortDriver, network: NetworkInfo, count: int
    ) -> list[Vif]:
        async with self._gate:
            started = time.monotonic()
            vifs = await driver.create(key, sgs, count, network)
            if vifs:
                self.sizer.bulk_created(time.monotonic() - started)
        keep, surplus = self._fit(key, vifs)
        self._pools.add(key, keep)
        if surplus:
            # The pool filled up while Neutron made them (recycled ports came back meanwhile).
            log.info("pool.max_surplus", key=key, deleted=len(surplus), max=self._settings.max)
            await driver.delete(key, surplus)
        return keep

    def _fit(self, key: PoolKey, vifs: list[Vif]) -> tuple[list[Vif], list[Vif]]:
        """The ports there is room for under ``pool.max`` now (waiters take theirs at once),
        and the rest."""
        if not self._settings.max:
            return vifs, []
        room = self._settings.max - self._pools.size(key) + self._pools.waiting(key)
        room = max(room, 0)
        return vifs[:room], vifs[room:]
