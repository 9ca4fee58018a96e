"""Leader election on one etcd key: watched, fenced, and campaigned for again after a loss.

The leader is whoever created the key; the key is bound to the leader's lease, so it goes when
the leader dies or stalls past the TTL. Candidates watch the key and try to create it only when
it is gone. The lease id is the fencing token: a leader's writes go in transactions guarded by
``fence()`` ("the key still exists and carries my lease"), so a leader that woke up after
another took over cannot write anything. Losing the lease ends the term, not the process:
``lead`` cleans up and campaigns again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

from podwire.backoff import Backoff
from podwire.errors import RetryableError
from podwire.etcd.client import Compare, EtcdClient, Lease, key_exists, lease_is
from podwire.etcd.watch import PrefixWatcher, WatchBatch
from podwire.log import get_logger

log = get_logger(__name__)

Term = Callable[[Lease], Coroutine[Any, Any, None]]


def fence(key: str, lease_id: int) -> list[Compare]:
    """Txn guards that hold only while ``key`` exists and is bound to ``lease_id``."""
    return [key_exists(key), lease_is(key, lease_id)]


class Election:
    def __init__(
        self,
        client: EtcdClient,
        key: str,
        ttl: int,
        value: Callable[[], bytes],
        backoff: Backoff | None = None,
    ) -> None:
        self._client = client
        self.key = key
        self._ttl = ttl
        self._value = value
        self._backoff = backoff or Backoff(0.2, 2.0)
        self.lease: Lease | None = None
        self._unrevoked: Lease | None = None
        self.terms = 0  # terms won, for operators and tests
        self.losses = 0  # terms that ended by a lost lease or a retryable failure

    @property
    def is_leader(self) -> bool:
        return self.lease is not None

    def fence(self) -> list[Compare]:
        return fence(self.key, self.lease.id if self.lease is not None else -1)

    async def campaign(self) -> Lease:
        """Return the lease once elected; etcd failures meanwhile are retried with backoff."""
        while True:
            try:
                return await self._campaign_once()
            except RetryableError as exc:
                delay = await self._backoff.sleep()
                log.warning("etcd.election.retry", key=self.key, error=str(exc), delay=delay)

    async def _campaign_once(self) -> Lease:
        if self._unrevoked is not None:
            await self._unrevoked.revoke()
            self._unrevoked = None
        watcher = PrefixWatcher(self._client, self.key)
        present = False
        async with contextlib.aclosing(watcher.batches()) as batches:
            async for batch in batches:  # the listing, then every change of the key
                present = _present_after(batch, self.key, present)
                if present:
                    continue
                lease = await self._try()
                if lease is not None:
                    return lease
                present = True
                log.info("etcd.election.standby", key=self.key)
        raise AssertionError("unreachable: the watcher never ends")

    async def _try(self) -> Lease | None:
        lease = await self._client.grant_lease(self._ttl)
        try:
            created = await self._client.create_if_absent(self.key, self._value(), lease.id)
        except BaseException:
            with contextlib.suppress(RetryableError):
                await asyncio.shield(lease.revoke())
            raise
        if not created:
            await lease.revoke()
            return None
        self.lease = lease
        self.terms += 1
        # No backoff reset here: a term that ends at once (a dependency of the term is down)
        # must wait longer each time, not re-elect every 0.2 s; ``lead`` resets it after a
        # term that lasted.
        log.info("etcd.election.elected", key=self.key, lease=hex(lease.id))
        return lease

    async def hold(self) -> None:
        """Keep the lease alive; raises LeaseLost when leadership is gone."""
        if self.lease is None:
            raise AssertionError("hold() before campaign()")
        await self.lease.keepalive()

    async def resign(self) -> None:
        """Give the key up at once; if etcd is away, the next campaign revokes it first.

        Without that, a restarted etcd (which extends every lease by its TTL) would keep our
        own old key, and this candidate would wait a full TTL for itself.
        """
        lease, self.lease = self.lease, None
        if lease is not None:
            try:
                await asyncio.shield(lease.revoke())
            except RetryableError:
                self._unrevoked = lease

    async def lead(self, term: Term) -> None:
        """Forever: campaign, then run ``term`` while holding the lease; after a loss, again.

        A term ends on a lost lease, a failed fence (NotLeader) or any other retryable error
        of ``term``; the key is given up and the next campaign waits the backoff first, so a
        term that keeps failing does not spin. Permanent errors and cancellation leave.
        """
        while True:
            lease = await self.campaign()
            started = time.monotonic()
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self.hold())
                    group.create_task(term(lease))
            except* RetryableError as failed:
                self.losses += 1
                log.warning(
                    "etcd.election.term_ended", key=self.key, error=str(failed.exceptions[0])
                )
            finally:
                await self.resign()
            if time.monotonic() - started > self._backoff.maximum:
                self._backoff.reset()
            await self._backoff.sleep()


def _present_after(batch: WatchBatch, key: str, present: bool) -> bool:
    for event in batch.events:
        if event.key == key:
            present = event.kind == "put"
    return present
