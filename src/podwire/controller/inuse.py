"""In-use attachments in etcd (``/podwire/vifs/<node>/<attachment>``), written in groups.

The record is what tells a restarted (or newly elected) controller that a port belongs to a
pod and must not go back to a pool. Writes are coalesced: every write waiting while one etcd
transaction is in flight goes into the next one, so a burst of requests costs a few round
trips instead of one each. Each transaction is fenced by the leader key, so a deposed leader
cannot record anything.

A transaction etcd fails to answer is sent again for a few seconds: its puts and deletes are
idempotent, so one that etcd may have applied before the error is safe to repeat, and an etcd
leader election (1-2 s) then delays the waiting requests instead of failing each of them back
to its agent, which would retry only after its own delay.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from podwire import keys
from podwire.backoff import Backoff
from podwire.errors import EtcdUnavailable, NotLeader, ValidationError
from podwire.etcd.client import MAX_TXN_OPS, Compare, EtcdClient, Op, delete_op, put_op
from podwire.log import get_logger
from podwire.schema import fields
from podwire.schema.inuse import InUse, PoolKey
from podwire.schema.records import parse_in_use

log = get_logger(__name__)

RETRY_SECONDS = 5.0  # an election takes 1-2 s; longer is an outage the agents' retries ride out
# A group of small writes answers in milliseconds; one lost to a leader that died is re-sent
# after this long instead of etcd.timeout.
ATTEMPT_SECONDS = 0.3


def parse_record(etcd_key: str, raw: bytes) -> InUse:
    """Rebuild a record from etcd; raises ValidationError for anything malformed."""
    prefix = keys.vifs_prefix()
    parts = etcd_key[len(prefix) :].split("/") if etcd_key.startswith(prefix) else []
    if len(parts) != 2:
        raise ValidationError(f"{etcd_key}: not a /podwire/vifs/<node>/<attachment> key")
    node = fields.name(parts[0], f"{etcd_key}: node")
    attachment = fields.attachment(parts[1], f"{etcd_key}: attachment")
    value = parse_in_use(raw, etcd_key)
    legacy = None if attachment == parts[1] else etcd_key
    key = PoolKey(node, value.project_id, value.vif.network_id)
    return InUse(node, attachment, key, value.vif, legacy, value.pod)


class InUseStore:
    def __init__(
        self,
        etcd: EtcdClient,
        fence: Callable[[], Sequence[Compare]],
        on_retry: Callable[[], None] = lambda: None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self._etcd = etcd
        self._fence = fence
        self._on_retry = on_retry
        self._retry_seconds = retry_seconds
        self._queue: list[tuple[Op, asyncio.Future[None]]] = []
        self._flushing = False

    async def load(self) -> tuple[list[InUse], int]:
        """Every parseable record (bad ones are logged and skipped) and how many were bad."""
        items, _ = await self._etcd.get_prefix(keys.vifs_prefix())
        records, bad = [], 0
        for kv in items:
            try:
                records.append(parse_record(kv.key, kv.value))
            except ValidationError as exc:
                bad += 1
                log.warning("controller.inuse.bad_record", key=kv.key, error=str(exc))
        await self._migrate([r for r in records if r.legacy_key is not None])
        return records, bad

    async def _migrate(self, legacy: list[InUse]) -> None:
        """Move records to their canonical keys; both in one fenced txn, so a record is
        never lost nor doubled."""
        for record in legacy:
            assert record.legacy_key is not None
            new = put_op(keys.vif(record.node, record.attachment), record.encode())
            held, _ = await self._etcd.txn(self._fence(), [new, delete_op(record.legacy_key)])
            if not held:
                raise NotLeader("leadership lost while migrating in-use records")
        if legacy:
            log.info("controller.inuse.migrated", records=len(legacy))

    async def put(self, record: InUse) -> None:
        await self._submit(put_op(keys.vif(record.node, record.attachment), record.encode()))

    async def delete(self, node: str, attachment: str) -> None:
        await self._submit(delete_op(keys.vif(node, attachment)))

    async def _submit(self, op: Op) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((op, done))
        if not self._flushing:
            self._flushing = True
            asyncio.create_task(self._flush())  # noqa: RUF006 - it finishes every future it takes
        await done

    async def _flush(self) -> None:
        try:
            while self._queue:
                chunk, self._queue = self._queue[:MAX_TXN_OPS], self._queue[MAX_TXN_OPS:]
                await self._commit(chunk)
        finally:
            self._flushing = False

    async def _txn(self, ops: list[Op]) -> bool:
        """The fenced transaction, repeated while etcd does not answer (see the module's
        docstring); whether the fence held."""
        backoff = Backoff(initial=0.05, maximum=0.5)
        give_up = time.monotonic() + self._retry_seconds
        while True:
            try:
                held, _ = await self._etcd.txn(self._fence(), ops, within=ATTEMPT_SECONDS)
                return held
            except EtcdUnavailable as exc:
                delay = backoff.next()
                if time.monotonic() + delay > give_up:
                    raise
                log.info("controller.inuse.retry", ops=len(ops), error=str(exc))
                self._on_retry()
                await asyncio.sleep(delay)

    async def _commit(self, chunk: list[tuple[Op, asyncio.Future[None]]]) -> None:
        try:
            held = await self._txn([op for op, _ in chunk])
            error: BaseException | None = None if held else NotLeader("leadership lost")
        except Exception as exc:  # handed to every waiting caller, who re-raises it
            error = exc
        for _, done in chunk:
            if done.done():
                continue
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)
