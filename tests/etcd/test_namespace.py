"""An etcd client in a deployment's namespace, against the real etcd: every call's keys carry
the namespace on the wire and come back without it, so two deployments' identical key layouts
never meet, and a view on one connection (the ml2 driver's) sees only its own."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from podwire.etcd.client import EtcdClient, key_absent, put_op
from podwire.etcd.watch import PrefixWatcher
from tests.etcd_tools import delete_prefix

pytestmark = pytest.mark.stack


async def test_a_view_reads_writes_and_watches_only_its_namespace(etcd: EtcdClient) -> None:
    space = f"/podwire-deployments/t{uuid.uuid4().hex[:8]}"
    view = etcd.within(space)
    key = f"/podwire/test-ns/{uuid.uuid4().hex}"
    try:
        await view.put(key + "/a", b"1")
        assert (await etcd.get(space + key + "/a")).value == b"1"  # type: ignore[union-attr]
        assert await etcd.get(key + "/a") is None
        created = await view.create_if_absent(key + "/b", b"2")
        assert created and not await view.create_if_absent(key + "/b", b"3")
        swapped, _ = await view.txn([key_absent(key + "/c")], [put_op(key + "/c", b"4")])
        assert swapped and (await etcd.get(space + key + "/c")) is not None
        listed, _ = await view.get_prefix(key + "/")
        assert [kv.key for kv in listed] == [key + "/a", key + "/b", key + "/c"]
        assert (await etcd.get_prefix(key + "/"))[0] == []

        watcher = PrefixWatcher(view, key + "/")
        batches = watcher.batches()
        first = await anext(batches)
        assert {e.key for e in first.events} == {key + "/a", key + "/b", key + "/c"}
        await etcd.put(key + "/a", b"outside")  # the same key outside the namespace: unseen
        await view.delete(key + "/b")
        event = (await asyncio.wait_for(anext(batches), 10)).events[0]
        assert (event.kind, event.key) == ("delete", key + "/b")
        await batches.aclose()
        await view.close()  # a view leaves the shared channels open
        assert await etcd.get(space + key + "/a") is not None
    finally:
        await delete_prefix(etcd, space + "/")
        await delete_prefix(etcd, key + "/")
