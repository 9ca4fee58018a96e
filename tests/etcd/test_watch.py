"""List-then-watch against the real etcd: order, resume, compaction, server restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from podwire.config import EtcdSettings
from podwire.errors import EtcdUnavailable
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher, WatchBatch
from tests.etcd_tools import compact

from .conftest import PrivateEtcd


async def next_batch(stream: AsyncIterator[WatchBatch], timeout: float = 10) -> WatchBatch:
    return await asyncio.wait_for(anext(stream), timeout)


async def collect_until(
    stream: AsyncIterator[WatchBatch], view: dict[str, bytes], wanted: dict[str, bytes]
) -> list[WatchBatch]:
    """Apply batches to ``view`` until it equals ``wanted``."""
    seen = []
    while view != wanted:
        batch = await next_batch(stream)
        seen.append(batch)
        apply(view, batch)
    return seen


async def put_when_back(client: EtcdClient, key: str, value: bytes) -> None:
    """A put right after a restart may meet the channel still in reconnect backoff; like any
    caller of a retryable error, retry (for at most 30 s)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        try:
            await client.put(key, value)
            return
        except EtcdUnavailable:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


def apply(view: dict[str, bytes], batch: WatchBatch) -> None:
    for event in batch.events:
        if event.kind == "put":
            view[event.key] = event.value
        else:
            view.pop(event.key, None)


async def test_initial_listing_then_ordered_events(etcd: EtcdClient, prefix: str) -> None:
    await etcd.put(prefix + "a", b"1")
    await etcd.put(prefix + "b", b"2")
    watcher = PrefixWatcher(etcd, prefix)
    stream = watcher.batches()
    first = await next_batch(stream)
    assert not first.relisted
    assert {(e.kind, e.key, e.value) for e in first.events} == {
        ("put", prefix + "a", b"1"),
        ("put", prefix + "b", b"2"),
    }
    for index in range(20):
        await etcd.put(prefix + "a", str(index).encode())
    await etcd.delete(prefix + "b")
    events = []
    while len(events) < 21:
        events.extend((await next_batch(stream)).events)
    assert [e.value for e in events[:20]] == [str(i).encode() for i in range(20)]
    assert (events[20].kind, events[20].key) == ("delete", prefix + "b")
    revisions = [e.mod_revision for e in events]
    assert revisions == sorted(revisions)
    await stream.aclose()


async def test_compaction_relists_and_reports_difference(etcd: EtcdClient, prefix: str) -> None:
    for name in ("keep", "change", "remove"):
        await etcd.put(prefix + name, b"old")
    watcher = PrefixWatcher(etcd, prefix)
    stream = watcher.batches()
    view: dict[str, bytes] = {}
    apply(view, await next_batch(stream))
    await stream.aclose()  # the consumer goes away; changes happen; history is compacted
    await etcd.put(prefix + "change", b"new")
    await etcd.delete(prefix + "remove")
    await etcd.put(prefix + "added", b"new")
    await compact(etcd, await etcd.status())

    stream = watcher.batches()
    batch = await next_batch(stream)
    assert batch.relisted
    assert {(e.kind, e.key) for e in batch.events} == {
        ("put", prefix + "change"),
        ("delete", prefix + "remove"),
        ("put", prefix + "added"),
    }
    apply(view, batch)
    assert view == {prefix + "keep": b"old", prefix + "change": b"new", prefix + "added": b"new"}
    assert watcher.relists == 1
    await etcd.put(prefix + "after", b"1")  # and the watch goes on after the re-list
    assert (await next_batch(stream)).events[0].key == prefix + "after"
    await stream.aclose()


async def test_resume_without_compaction_replays_history(etcd: EtcdClient, prefix: str) -> None:
    watcher = PrefixWatcher(etcd, prefix)
    stream = watcher.batches()
    assert (await next_batch(stream)).events == []
    await stream.aclose()
    for index in range(3):
        await etcd.put(prefix + "k", str(index).encode())
    stream = watcher.batches()
    batch = await next_batch(stream)
    assert not batch.relisted
    assert [e.value for e in batch.events] == [b"0", b"1", b"2"]
    await stream.aclose()


async def test_watch_survives_etcd_restart(private_etcd: PrivateEtcd) -> None:
    settings = EtcdSettings(endpoints=[private_etcd.server.client_url], timeout=2)
    async with await EtcdClient.connect(settings) as client:
        await client.put("/r/before", b"1")
        watcher = PrefixWatcher(client, "/r/", retry_max=0.5)
        stream = watcher.batches()
        view: dict[str, bytes] = {}
        apply(view, await next_batch(stream))
        assert view == {"/r/before": b"1"}

        pending = asyncio.ensure_future(next_batch(stream, timeout=60))
        await asyncio.sleep(0.2)
        private_etcd.stop()
        await asyncio.sleep(1.0)  # the watcher is now retrying against a dead server
        assert not pending.done()
        private_etcd.start()
        await put_when_back(client, "/r/after", b"2")
        await client.delete("/r/before")
        apply(view, await pending)
        await collect_until(stream, view, {"/r/after": b"2"})
        await stream.aclose()


async def test_restart_and_compaction_while_disconnected(private_etcd: PrivateEtcd) -> None:
    """The watcher was away across a restart and a compaction: it still converges."""
    settings = EtcdSettings(endpoints=[private_etcd.server.client_url], timeout=2)
    async with await EtcdClient.connect(settings) as client:
        for index in range(5):
            await client.put(f"/c/{index}", b"v1")
        watcher = PrefixWatcher(client, "/c/")
        stream = watcher.batches()
        view: dict[str, bytes] = {}
        apply(view, await next_batch(stream))
        await stream.aclose()
        private_etcd.stop()
        private_etcd.start()
        await put_when_back(client, "/c/0", b"v2")
        await client.delete("/c/1")
        await compact(client, await client.status())
        stream = watcher.batches()
        await collect_until(
            stream, view, {"/c/0": b"v2", "/c/2": b"v1", "/c/3": b"v1", "/c/4": b"v1"}
        )
        assert watcher.relists == 1
        await stream.aclose()


async def test_replay_resends_everything_after_a_consumer_failure(
    etcd: EtcdClient, prefix: str
) -> None:
    """A consumer that failed half-way through a batch gets the whole picture again."""
    await etcd.put(prefix + "a", b"1")
    await etcd.put(prefix + "b", b"1")
    watcher = PrefixWatcher(etcd, prefix)
    stream = watcher.batches()
    assert {e.key for e in (await next_batch(stream)).events} == {prefix + "a", prefix + "b"}
    await etcd.delete(prefix + "a")
    lost = await next_batch(stream)  # the consumer fails while applying this delete
    assert [(e.kind, e.key) for e in lost.events] == [("delete", prefix + "a")]
    await stream.aclose()
    assert watcher.health.problem is None

    watcher.replay()
    await etcd.put(prefix + "c", b"1")
    stream = watcher.batches()
    again = await next_batch(stream)
    assert again.relisted
    assert {(e.kind, e.key) for e in again.events} == {
        ("delete", prefix + "a"),
        ("put", prefix + "b"),
        ("put", prefix + "c"),
    }
    await stream.aclose()


async def test_health_names_the_problem_while_etcd_is_away(private_etcd: PrivateEtcd) -> None:
    settings = EtcdSettings(endpoints=[private_etcd.server.client_url], timeout=1)
    async with await EtcdClient.connect(settings) as client:
        watcher = PrefixWatcher(client, "/h/", retry_max=0.2)
        stream = watcher.batches()
        await next_batch(stream)
        pending = asyncio.ensure_future(next_batch(stream, timeout=60))
        private_etcd.stop()
        try:
            async with asyncio.timeout(20):
                while watcher.health.problem is None:
                    await asyncio.sleep(0.05)
            assert "etcd" in watcher.health.problem
        finally:
            private_etcd.start()
        await put_when_back(client, "/h/x", b"1")
        await pending
        assert watcher.health.problem is None
        await stream.aclose()
