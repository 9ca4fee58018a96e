"""The one election (controller and ml2 forwarder) on a real etcd: standby, fence, re-campaign."""

from __future__ import annotations

import asyncio
import contextlib

from podwire.backoff import Backoff
from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient, Lease, put_op
from podwire.etcd.election import Election
from tests.etcd.conftest import PrivateEtcd
from tests.scripted_agent import eventually


def candidate(client: EtcdClient, key: str, name: str, ttl: int = 2) -> Election:
    return Election(client, key, ttl, name.encode, Backoff(0.05, 0.5))


async def fenced_put(client: EtcdClient, election: Election, key: str) -> bool:
    held, _ = await client.txn(election.fence(), [put_op(key, b"x")])
    return held


async def test_standby_waits_then_takes_over_and_the_old_fence_fails(
    etcd: EtcdClient, prefix: str
) -> None:
    key = prefix + "election"
    first, second = candidate(etcd, key, "a"), candidate(etcd, key, "b")
    await first.campaign()
    waiting = asyncio.create_task(second.campaign())
    await asyncio.sleep(0.5)
    assert not waiting.done() and not second.is_leader
    assert await fenced_put(etcd, first, prefix + "data")
    assert not await fenced_put(etcd, second, prefix + "data")
    old = first.fence()

    await first.resign()
    lease = await asyncio.wait_for(waiting, 10)
    current = await etcd.get(key)
    assert current is not None and current.value == b"b" and current.lease == lease.id
    held, _ = await etcd.txn(old, [put_op(prefix + "data", b"stale")])
    assert not held
    assert await fenced_put(etcd, second, prefix + "data")
    await second.resign()
    assert await etcd.get(key) is None


async def test_a_term_lost_in_an_etcd_stall_is_campaigned_for_again(
    private_etcd: PrivateEtcd,
) -> None:
    settings = EtcdSettings(endpoints=[private_etcd.server.client_url], timeout=1.0)
    async with await EtcdClient.connect(settings) as client:
        election = candidate(client, "/election/x", "a")
        terms: list[Lease] = []
        ended: list[int] = []

        async def term(lease: Lease) -> None:
            terms.append(lease)
            try:
                await asyncio.Event().wait()
            finally:
                ended.append(lease.id)

        leading = asyncio.create_task(election.lead(term))
        try:
            await eventually(lambda: _count(terms, 1), "first term")
            first = terms[0]
            await private_etcd.stall(6.0)  # three TTLs
            await eventually(lambda: _count(terms, 2), "a second term after the stall", 60)
            assert ended[0] == first.id  # the first term was ended, not left running
            assert election.losses >= 1 and election.lease is terms[-1]
            current = await client.get("/election/x")
            assert current is not None and current.lease == terms[-1].id != first.id
            assert not leading.done()
        finally:
            leading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await leading
        assert await client.get("/election/x") is None  # cancelling resigned


async def _count(items: list[Lease], at_least: int) -> bool:
    return len(items) >= at_least
