"""Replays the journal into etcd, in order, from exactly one process at a time.

Leadership is ``podwire.etcd.election`` (the same election the controller uses): an etcd key
bound to a lease, campaigned for again after a loss. The lease id is also the fencing token:
each batch is one etcd txn guarded by the election's fence, so a forwarder that stalled past
its TTL and woke up after another took over cannot write a single stale key.
Rows are deleted only after etcd accepted their txn; a crash in between replays them, which is
harmless because later rows are never sent before earlier ones.

Rows name keys as etcd stores them, a deployment's namespace in front, except the policy keys
(``/podwire/global/``): every deployment's agents read the same groups, so such a row is written
once into each namespace the driver serves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from podwire import keys
from podwire.backoff import Backoff
from podwire.errors import EtcdUnavailable, NotLeader, RetryableError
from podwire.etcd.client import EtcdClient, Lease, Op, delete_op, put_op
from podwire.etcd.election import Election, fence
from podwire.etcd.watch import PrefixWatcher
from podwire.log import get_inline_logger
from podwire.ml2.journal import Entry
from podwire.ml2.policy_resync import PolicySource, resync
from podwire.schema.records import leader_value

log = get_inline_logger(__name__)

# Seconds per batch attempt (at most etcd_timeout): a batch a member forwarded to a leader that
# just died is never answered, and replaying it is harmless (see above), so waiting the whole
# etcd_timeout would only hold every port binding back that much longer.
ATTEMPT = 1.0


class Journal(Protocol):
    """The forwarder's view of the journal; blocking calls, run off the event loop."""

    def fetch(self, limit: int) -> list[Entry]: ...

    def delete(self, ids: Sequence[int]) -> None: ...

    def mark_attempt(self, ids: Sequence[int]) -> None: ...


@dataclass(frozen=True)
class ForwarderSettings:
    identity: str
    election_key: str = keys.election("forwarder")
    kick_key: str = keys.KICK
    lease_ttl: int = 10
    # etcd refuses txns of more than 128 operations by default (--max-txn-ops).
    batch_size: int = 100
    # ... and requests over 1.5 MiB (--max-request-bytes): a batch of large security-group
    # values is cut short of this many value bytes (always at least one row).
    batch_bytes: int = 1024 * 1024
    poll_interval: float = 10.0
    retry_initial: float = 0.2
    retry_max: float = 5.0


def within_bytes(rows: Sequence[Entry], limit: int) -> list[Entry]:
    """The longest prefix of ``rows`` whose keys and values fit ``limit`` bytes, at least one
    row; the rest stay in the journal for the next batch, in order."""
    total = 0
    for count, row in enumerate(rows):
        total += len(row.key) + len(row.value or "")
        if total > limit and count:
            return list(rows[:count])
    return list(rows)


def stored_keys(key: str, namespaces: Sequence[str]) -> list[str]:
    """The keys one journal row is written to: a policy key into every namespace."""
    if key.startswith(keys.global_prefix()):
        return [namespace + key for namespace in namespaces]
    return [key]


def batch_ops(rows: Sequence[Entry], namespaces: Sequence[str] = ("",)) -> list[Op]:
    """One op per key, the last row for it winning.

    etcd rejects a txn that touches a key twice; inside one atomic txn the earlier rows for a
    key are invisible anyway, so dropping them changes nothing an observer can see.
    """
    last: dict[str, Entry] = {}
    for row in rows:
        last.pop(row.key, None)
        last[row.key] = row
    return [
        delete_op(key) if row.value is None else put_op(key, row.value.encode())
        for row in last.values()
        for key in stored_keys(row.key, namespaces)
    ]


class Forwarder:
    def __init__(
        self,
        client: EtcdClient,
        journal: Journal,
        settings: ForwarderSettings,
        on_leadership: Callable[[bool], None] | None = None,
        policy: PolicySource | None = None,
        namespaces: Sequence[str] = ("",),
    ) -> None:
        """``namespaces``: the etcd namespaces of the deployments served."""
        self._client = client
        self._namespaces = list(namespaces)
        # A policy row becomes one op per namespace: batches shrink so a txn stays within
        # etcd's --max-txn-ops and --max-request-bytes.
        self._rows_per_batch = max(1, settings.batch_size // len(self._namespaces))
        self._bytes_per_batch = max(1, settings.batch_bytes // len(self._namespaces))
        self._journal = journal
        self._settings = settings
        self._on_leadership = on_leadership or (lambda _leader: None)
        self._wake = asyncio.Event()
        self._election = Election(
            client,
            settings.election_key,
            settings.lease_ttl,
            lambda: leader_value(settings.identity),
            Backoff(settings.retry_initial, settings.retry_max),
        )
        self._policy = policy
        self.is_leader = False
        self.sent_rows = 0
        self.backlog = False  # the last drain left rows behind
        # etcd revision of the last write under /podwire/global/ (``podwire status``).
        self.policy_revision = 0

    def wake(self) -> None:
        """Drain now; call on the event loop's thread."""
        self._wake.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch_kicks())
            group.create_task(self._elect_and_lead())

    async def _watch_kicks(self) -> None:
        watcher = PrefixWatcher(self._client, self._settings.kick_key)
        async for _batch in watcher.batches():
            self._wake.set()

    async def _elect_and_lead(self) -> None:
        await self._election.lead(self._lead)

    async def _lead(self, lease: Lease) -> None:
        self.is_leader = True
        self._on_leadership(True)
        try:
            await self._drain_forever(lease)
        finally:
            self.is_leader = False
            self._on_leadership(False)

    async def _drain_forever(self, lease: Lease) -> None:
        settings = self._settings
        backoff = Backoff(settings.retry_initial, settings.retry_max)
        await self._catch_up(lease, backoff)
        while True:
            self._wake.clear()
            try:
                await self.drain_once(lease)
            except NotLeader:
                raise
            except RetryableError as exc:
                delay = await backoff.sleep()
                log.warning("ml2.forwarder.drain_failed", error=str(exc), delay=delay)
                continue
            backoff.reset()
            if not self.backlog:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(settings.poll_interval):
                        await self._wake.wait()

    async def _catch_up(self, lease: Lease, backoff: Backoff) -> None:
        """On taking the lead: send what is queued, then resync the policy keys (once)."""
        if self._policy is None:
            return
        while True:
            try:
                while await self.drain_once(lease) and self.backlog:
                    pass
                await self.resync_policy(lease)
                return
            except NotLeader:
                raise
            except RetryableError as exc:
                delay = await backoff.sleep()
                log.warning("ml2.forwarder.resync_failed", error=str(exc), delay=delay)

    async def resync_policy(self, lease: Lease) -> None:
        assert self._policy is not None
        wanted = await asyncio.to_thread(self._policy.read)
        guards = fence(self._settings.election_key, lease.id)
        for namespace in self._namespaces:
            batch = self._settings.batch_size
            result = await resync(self._client, wanted, guards, batch, namespace)
            if result is None:
                raise NotLeader(f"election key {self._settings.election_key} lost during resync")
            self.policy_revision = max(self.policy_revision, result.revision)
            log.info(
                "ml2.forwarder.policy_resynced",
                namespace=namespace or "/",
                put=result.put,
                deleted=result.deleted,
                unchanged=result.unchanged,
                revision=result.revision,
            )

    async def drain_once(self, lease: Lease) -> int:
        """Send the oldest batch; returns how many rows went (0 when the journal is empty)."""
        settings = self._settings
        fetched = await asyncio.to_thread(self._journal.fetch, self._rows_per_batch)
        self.backlog = False
        if not fetched:
            return 0
        rows = within_bytes(fetched, self._bytes_per_batch)
        ids = [row.id for row in rows]
        guards = fence(settings.election_key, lease.id)
        try:
            ops = batch_ops(rows, self._namespaces)
            accepted, revision = await self._client.txn(guards, ops, within=ATTEMPT)
        except EtcdUnavailable:
            with contextlib.suppress(RetryableError):
                await asyncio.to_thread(self._journal.mark_attempt, ids)
            raise
        if not accepted:
            raise NotLeader(f"election key {settings.election_key} no longer carries our lease")
        await asyncio.to_thread(self._journal.delete, ids)
        self.sent_rows += len(rows)
        if any(row.key.startswith(keys.global_prefix()) for row in rows):
            self.policy_revision = revision
        log.debug("ml2.forwarder.sent", rows=len(rows), first=ids[0], revision=revision)
        # More may be waiting: the batch was full, or cut short by its size.
        self.backlog = len(fetched) == self._rows_per_batch or len(rows) < len(fetched)
        return len(rows)
