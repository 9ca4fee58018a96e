"""The controller's view of a node's liveness against the real etcd: the heartbeat key's beat,
not its lease (which any etcd user may refresh), says whether the node lives."""

from __future__ import annotations

import time
import uuid

from podwire import keys
from podwire.controller.liveness import Liveness
from podwire.etcd import EtcdClient
from podwire.schema import nodes as values


async def test_a_stale_beat_is_a_dead_node_whatever_its_lease(etcd: EtcdClient) -> None:
    nodes = {f"pwt-beat-{uuid.uuid4().hex[:6]}-{n}": n for n in ("fresh", "stale", "old", "junk")}
    lease = await etcd.grant_lease(60)
    now = time.time()
    written = {
        "fresh": values.alive_value(now, "t", now, 10),
        "stale": values.alive_value(now - 100, "t", now - 30, 10),  # three TTLs without a beat
        "old": values.alive_value(now - 100, "t"),  # an agent from before the beat
        "junk": b'{"v": 1, "started_at": 1, "ttl": 10}',  # a TTL without a beat
    }
    try:
        for node, kind in nodes.items():
            await etcd.put(keys.state_alive(node), written[kind], lease=lease.id)
        liveness = Liveness(etcd)
        alive = {kind for node, kind in nodes.items() if await liveness.alive(node)}
        assert alive == {"fresh", "old"}
        everyone = await liveness.alive_nodes()
        assert {kind for node, kind in nodes.items() if node in everyone} == {"fresh", "old"}
    finally:
        await lease.revoke()
