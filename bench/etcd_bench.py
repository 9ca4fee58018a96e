"""etcd layer: our client's put and watch delivery against aetcd's own client, same server."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aetcd

from bench.stats import row
from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher
from tests.etcd_tools import delete_prefix


async def _put_latencies(client: EtcdClient, prefix: str, count: int) -> list[float]:
    samples = []
    for index in range(count):
        started = time.perf_counter()
        await client.put(f"{prefix}{index}", b"x" * 200)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def _aetcd_put_latencies(url: str, prefix: str, count: int) -> list[float]:
    host, port = url.removeprefix("http://").split(":")
    samples = []
    async with aetcd.Client(host=host, port=int(port)) as client:
        for index in range(count):
            started = time.perf_counter()
            await client.put(f"{prefix}{index}".encode(), b"x" * 200)
            samples.append((time.perf_counter() - started) * 1000)
    return samples


async def _watch_latencies(client: EtcdClient, prefix: str, count: int) -> list[float]:
    watcher = PrefixWatcher(client, prefix)
    stream = watcher.batches()
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
    async with await EtcdClient.connect(EtcdSettings(endpoints=[url])) as client:
        ours = await _put_latencies(client, prefix + "p/", samples)
        reference = await _aetcd_put_latencies(url, prefix + "r/", samples)
        watch = await _watch_latencies(client, prefix, samples)
        await delete_prefix(client, prefix)
    return [
        row("etcd put (podwire client)", ours, "aetcd.Client.put", reference),
        row("etcd put -> watcher event", watch, "aetcd.Client.put", reference),
    ]


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_run(stack["etcd"], samples))
