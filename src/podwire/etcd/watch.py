"""List-then-watch over a key prefix that never misses a change.

A consumer sees one stream of batches. The first batch is the full listing (every key as a
put); after that, batches carry the watch events in revision order. When the watch cannot
resume (the revision it needs was compacted, or the stream broke for longer than etcd keeps
history), the prefix is listed again and the *difference* against what the consumer has
already seen is sent as synthetic puts and deletes, so the consumer's view converges without
it having to know a re-list happened.

etcd cancels a watch whose token it no longer knows (after a restart) with the same "permission
denied" as one the user's role does not allow; so a denied watch first gets a fresh token and
only a second denial in a row is final.

An unreachable etcd is retried with backoff for as long as it takes; meanwhile ``health``
names the problem, so readiness shows a watcher that follows nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import grpc
from aetcd import rpc

from podwire.backoff import Backoff
from podwire.errors import EtcdCompacted, EtcdUnavailable
from podwire.etcd.client import Endpoint, EtcdClient, KeyValue
from podwire.etcd.errors import EtcdPermissionDenied, denied, translate
from podwire.health import Health
from podwire.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    key: str
    value: bytes
    mod_revision: int


@dataclass(frozen=True)
class WatchBatch:
    events: list[WatchEvent]
    revision: int
    relisted: bool


class PrefixWatcher:
    """Iterate ``batches()`` to follow a prefix across reconnects and compactions."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        retry_initial: float = 0.1,
        retry_max: float = 2.0,
        probe_interval: float = 2.0,
    ) -> None:
        self._probe_interval = probe_interval
        self._client = client
        self._prefix = prefix
        self._backoff = Backoff(retry_initial, retry_max)
        self._seen: dict[str, int] = {}  # key -> mod revision the consumer has
        self._replay = False
        self._last: list[WatchEvent] = []  # the batch the consumer has now
        self.revision = 0
        self.relists = 0
        self._renewed_for_denial = False
        self.health = Health(f"watch {prefix}")

    def replay(self) -> None:
        """The consumer lost the last batch: the next iteration re-lists and sends every key.

        Keys that went meanwhile still arrive as deletes, so a consumer restarted after a
        failure converges exactly as after a compaction.
        """
        self._seen = dict.fromkeys(self._seen, -1)
        for event in self._last:
            if event.kind == "delete":
                self._seen[event.key] = -1  # still gone at the re-list: sent as a delete again
        self._replay = True

    async def batches(self) -> AsyncGenerator[WatchBatch, None]:
        need_list = self.revision == 0 or self._replay  # a resumed iteration tries the history
        while True:
            try:
                if need_list:
                    batch = await self._relist()
                    need_list = self._replay = False
                    self._healthy()
                    self._last = batch.events
                    yield batch
                async for batch in self._stream():
                    self._last = batch.events
                    yield batch
            except EtcdCompacted as exc:
                log.info(
                    "etcd.watch.compacted",
                    prefix=self._prefix,
                    needed=self.revision + 1,
                    oldest=exc.compact_revision,
                )
                need_list = True
            except EtcdUnavailable as exc:
                self.health.failing(str(exc))
                delay = self._backoff.next()
                log.warning("etcd.watch.retry", prefix=self._prefix, error=str(exc), delay=delay)
                await asyncio.sleep(delay)

    def _healthy(self) -> None:
        self.health.ok()
        self._backoff.reset()

    async def _relist(self) -> WatchBatch:
        items, revision = await self._client.get_prefix(self._prefix)
        current = {kv.key: kv for kv in items}
        events = [_put(kv) for kv in items if self._seen.get(kv.key) != kv.mod_revision]
        events += [
            WatchEvent("delete", key, b"", revision) for key in self._seen if key not in current
        ]
        self._seen = {kv.key: kv.mod_revision for kv in items}
        relisted = self.revision != 0
        self.relists += int(relisted)
        self.revision = revision
        return WatchBatch(events, revision, relisted)

    async def _stream(self) -> AsyncIterator[WatchBatch]:
        start, end = self._client.raw_range(self._prefix)
        create = rpc.WatchCreateRequest(
            key=start,
            range_end=end,
            start_revision=self.revision + 1,
            progress_notify=True,
        )
        metadata = await self._client.auth_metadata()
        endpoint = self._client.endpoint
        # "hasleader": a member cut off from the cluster's leader cancels the stream instead
        # of silently sending nothing.
        call = endpoint.watch.Watch(metadata=(*metadata, ("hasleader", "true")))
        read: asyncio.Future[Any] | None = None
        try:
            await call.write(rpc.WatchRequest(create_request=create))
            while True:
                read = asyncio.ensure_future(call.read())
                response = await self._answer(read, endpoint)
                if response is grpc.aio.EOF:
                    raise EtcdUnavailable("etcd watch: stream closed by server")
                batch = self._handle(response)
                if batch is not None:
                    yield batch
        except grpc.aio.AioRpcError as exc:
            self._renewed_for_denial = False  # a new connection may meet a forgotten token
            self._client.failed(endpoint, exc.details() or exc.code().name)
            raise translate(exc, f"watch {self._prefix}", self._client.user) from exc
        except EtcdUnavailable as exc:
            self._client.failed(endpoint, str(exc))
            raise
        except EtcdPermissionDenied:
            if self._renewed_for_denial or not await self._client.renew_token(metadata):
                raise
            self._renewed_for_denial = True
            raise EtcdUnavailable(f"etcd watch {self._prefix}: denied; token renewed") from None
        finally:
            if read is not None:
                read.cancel()
            call.cancel()

    async def _answer(self, read: asyncio.Future[Any], endpoint: Endpoint) -> Any:
        """The next message; while none comes, the member is probed every ``probe_interval``
        so a stopped member (SIGSTOP, a partition) ends the stream within about two probes
        instead of never: TCP and gRPC keepalives take a minute or more to notice."""
        while True:
            done, _ = await asyncio.wait({read}, timeout=self._probe_interval)
            if done:
                return read.result()
            await self._client.probe(endpoint, self._probe_interval)

    def _handle(self, response: Any) -> WatchBatch | None:
        if response.compact_revision:
            raise EtcdCompacted(int(response.compact_revision))
        if response.canceled:
            reason = response.cancel_reason or "no reason"
            if "permission denied" in reason:
                raise denied(f"watch {self._prefix}", self._client.user)
            raise EtcdUnavailable(f"etcd watch canceled: {reason}")
        if response.created:
            self._renewed_for_denial = False
            # The ack's header revision is "now", but older events may still be on their
            # way, so it must not advance the resume point.
            self._healthy()
            return None
        if not response.events:
            # Progress notification: sent only once this watcher has caught up, so its
            # revision is a safe resume point after a long quiet period.
            self.revision = max(self.revision, int(response.header.revision))
            return None
        events = [_event(raw, self._client) for raw in response.events]
        for event in events:
            if event.kind == "put":
                self._seen[event.key] = event.mod_revision
            else:
                self._seen.pop(event.key, None)
        self.revision = max(self.revision, events[-1].mod_revision)
        return WatchBatch(events, self.revision, relisted=False)


def _put(kv: KeyValue) -> WatchEvent:
    return WatchEvent("put", kv.key, kv.value, kv.mod_revision)


def _event(raw: Any, client: EtcdClient) -> WatchEvent:
    kind: Literal["put", "delete"] = "delete" if raw.type == rpc.Event.DELETE else "put"
    key = client.logical_key(raw.kv.key)
    return WatchEvent(kind, key, bytes(raw.kv.value), int(raw.kv.mod_revision))
