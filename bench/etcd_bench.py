"""etcd layer: our client's put and watch delivery against aetcd's own client, same server."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aetcd

from bench.stats import row, timed
from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher
from tests.etcd_tools import delete_prefix


async def _watch_latencies(client: EtcdClient, prefix: str, count: int) -> list[float]:
    stream = PrefixWatcher(client, prefix).batches()
    await anext(stream)
    samples = []
    for index in range(count):
        started = time.perf_counter()
        await client.put(f"{prefix}w{index}", b"1")
        await anext(stream)
        samples.append((time.perf_counter() - started) * 1000)
    await stream.aclose()  # type: ignore[attr-defined]
    return samples


async def _run(url: str, samples: int) -> list[dict[str, Any]]:
    prefix = f"/podwire-bench/{uuid.uuid4().hex}/"
    value = b"x" * 200
    host, port = url.removeprefix("http://").split(":")
    async with await EtcdClient.connect(EtcdSettings(endpoints=[url])) as client:
        ours = [await timed(client.put, f"{prefix}p/{i}", value) for i in range(samples)]
        async with aetcd.Client(host=host, port=int(port)) as theirs:
            keys = [f"{prefix}r/{i}".encode() for i in range(samples)]
            reference = [await timed(theirs.put, key, value) for key in keys]
        watch = await _watch_latencies(client, prefix, samples)
        await delete_prefix(client, prefix)
    return [
        row("etcd put (podwire client)", ours, "aetcd.Client.put", reference),
        row("etcd put -> watcher event", watch, "aetcd.Client.put", reference),
    ]


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_run(stack["etcd"], samples))
