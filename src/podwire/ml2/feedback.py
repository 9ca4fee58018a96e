"""Turns what agents report under ``/podwire/state/`` into Neutron port status.

Every API worker feeds its own binding cache from the watch (bindings can land in any worker),
but only the elected one talks to Neutron, so a state change is acted on once. On becoming
active and after a re-list (compaction, long outage) it reconciles from the full picture
rather than from the missed events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from podwire import keys
from podwire.backoff import Backoff
from podwire.errors import RetryableError
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher
from podwire.log import get_inline_logger
from podwire.ml2.host_cache import HostCache, StateChange

log = get_inline_logger(__name__)

RETRY = Backoff(0.5, 30.0)  # only its delay(attempt): each change counts its own attempts
# Ports acted on at once: each is a short Neutron DB transaction in a thread, and a burst of
# pods (or a resync) must not wait for them one by one.
PARALLEL_PORTS = 8
# How long after completing a port's L2 block feedback looks at it once more. Neutron's
# provisioning_complete removes one block and then looks for others; two completions a few
# milliseconds apart (ours and the DHCP agent's) can each still see the other's block, and
# then neither announces the port ACTIVE although nothing blocks it any more.
SETTLE_DELAY = 1.0


class PortStatusSink(Protocol):
    """Neutron as feedback sees it; blocking calls, run off the event loop."""

    def port_wired(self, host: str, port_id: str) -> bool:
        """Complete the L2 provisioning block if the port is bound to ``host``."""
        ...

    def port_settled(self, host: str, port_id: str) -> bool:
        """Complete again a port bound to ``host`` that is still DOWN; True if it did."""
        ...

    def port_unwired(self, host: str, port_id: str) -> bool:
        """Set the port DOWN if it is still bound to ``host``."""
        ...

    def host_down(self, host: str) -> int:
        """Set every podwire port bound to ``host`` DOWN; returns how many."""
        ...


class Feedback:
    def __init__(
        self,
        client: EtcdClient,
        cache: HostCache,
        sink: PortStatusSink,
        is_active: Callable[[], bool],
        prefix: str = keys.state_prefix(),
    ) -> None:
        self._client = client
        self.cache = cache
        self._sink = sink
        self._is_active = is_active
        self._prefix = prefix
        self._lock = asyncio.Lock()
        self._group: asyncio.TaskGroup | None = None
        self.watcher: PrefixWatcher | None = None

    async def run(self) -> None:
        """Follow the state prefix; retries and resyncs run in this TaskGroup, none is lost."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            try:
                await self._follow()
            finally:
                self._group = None

    def request_resync(self) -> None:
        """Resync in the background (on becoming leader); dropped if feedback is not running."""
        self._spawn(self.resync())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._group is None:
            coro.close()
            return
        self._group.create_task(coro)

    async def _follow(self) -> None:
        self.watcher = PrefixWatcher(self._client, self._prefix)
        async for batch in self.watcher.batches():
            changes: list[StateChange] = []
            for event in batch.events:
                changes += self.cache.apply(event.kind, event.key, event.value)
            first = not self.cache.synced.is_set()
            self.cache.synced.set()
            if not self._is_active():
                continue
            if first or batch.relisted:
                log.info("ml2.feedback.resync", relisted=batch.relisted)
                await self.resync()
            else:
                await self._act(changes)

    async def resync(self) -> None:
        """Bring Neutron in line with everything the cache knows."""
        changes = [StateChange("host_down", host) for host in self.cache.dead_hosts()]
        for host, port in self.cache.wired_ports():
            changes.append(StateChange("port_wired", host, port))
        await self._act(changes, settle=False)  # a burst of settled ports: no second look

    async def _act(self, changes: list[StateChange], settle: bool = True) -> None:
        """Host changes first, in order; then each port's changes in order, several ports at
        once. A batch is done before the next is read, so no port's changes overtake."""
        by_port: dict[str, list[StateChange]] = {}
        async with self._lock:
            for change in changes:
                if change.port_id is None:
                    await self._act_one(change, settle=settle)
                else:
                    by_port.setdefault(change.port_id, []).append(change)
            gate = asyncio.Semaphore(PARALLEL_PORTS)

            async def in_order(port_changes: list[StateChange]) -> None:
                async with gate:
                    for change in port_changes:
                        await self._act_one(change, settle=settle)

            await asyncio.gather(*(in_order(c) for c in by_port.values()))

    async def _act_one(self, change: StateChange, attempt: int = 0, settle: bool = True) -> None:
        host, port = change.host, change.port_id
        try:
            if change.kind == "port_wired" and port is not None:
                if not self.cache.get(host).alive:
                    log.info("ml2.feedback.wired_on_dead_host", host=host, port=port)
                    return
                done = await asyncio.to_thread(self._sink.port_wired, host, port)
                log.info("ml2.feedback.port_wired", host=host, port=port, completed=done)
                if done and settle:
                    self._spawn(self._settle(host, port))
            elif change.kind == "port_unwired" and port is not None:
                done = await asyncio.to_thread(self._sink.port_unwired, host, port)
                log.info("ml2.feedback.port_unwired", host=host, port=port, set_down=done)
            elif change.kind == "host_down":
                count = await asyncio.to_thread(self._sink.host_down, host)
                log.warning("ml2.feedback.host_down", host=host, ports_down=count)
            elif change.kind == "host_up":
                log.info("ml2.feedback.host_up", host=host)
                for _host, wired in self.cache.wired_ports(host):
                    await self._act_one(StateChange("port_wired", host, wired), settle=False)
        except RetryableError as exc:
            delay = RETRY.delay(attempt)
            log.error(
                "ml2.feedback.neutron_failed",
                change=change.kind,
                host=host,
                port=port,
                error=str(exc),
                retry_in=delay,
            )
            self._spawn(self._retry(change, attempt + 1, delay))

    async def _settle(self, host: str, port: str) -> None:
        """Look once more a moment after completing (see SETTLE_DELAY), in the port's turn
        and only while its host still reports it wired: a port set DOWN meanwhile (unwired,
        host down) must not be completed into ACTIVE again."""
        await asyncio.sleep(SETTLE_DELAY)
        async with self._lock:
            if not self._is_active() or not self.cache.is_wired(host, port):
                return
            try:
                repeated = await asyncio.to_thread(self._sink.port_settled, host, port)
            except RetryableError as exc:
                log.warning("ml2.feedback.settle_failed", host=host, port=port, error=str(exc))
                return
        if repeated:
            log.info("ml2.feedback.completion_repeated", host=host, port=port)

    async def _retry(self, change: StateChange, attempt: int, delay: float) -> None:
        """Act again later; the sink re-reads the port, so a stale retry does no harm."""
        await asyncio.sleep(delay)
        if self._is_active():
            async with self._lock:
                await self._act_one(change, attempt)
