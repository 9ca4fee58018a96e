"""The controller follows the ml2 forwarder's mirror of bound ports, so its pools agree with
Neutron without asking it.

Every binding Neutron makes, changes or removes for podwire reaches ``/podwire/nodes/<host>/
ports/<id>`` through the journal written in the port's own transaction, normally before
Neutron's HTTP answer. The leader lists that prefix at the start of its term and then watches
it: a pooled port that Neutron deletes or unbinds leaves its pool at once, one re-addressed or
moved to other groups is handed out as it is now, and a new port is handed out only once its
binding is there (its node wires it from that same entry). Recovery, recycling and the
sweeper keep their own reads; this only keeps the free ports current between them.
"""

from __future__ import annotations

import asyncio
import contextlib

from podwire import keys
from podwire.controller.mirror import mirrored_vif
from podwire.controller.pool_service import PoolService
from podwire.controller.pools import Pools
from podwire.errors import ValidationError
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher, WatchBatch, WatchEvent
from podwire.log import get_logger
from podwire.schema.inuse import PoolKey
from podwire.schema.vif import Vif

log = get_logger(__name__)


class MirrorFollower:
    """One leader term's list-then-watch of the mirror; also the pools' ``MirrorView``."""

    def __init__(self, etcd: EtcdClient) -> None:
        self._watcher = PrefixWatcher(etcd, keys.nodes_prefix())
        self._ports: dict[str, tuple[PoolKey, Vif]] = {}
        self.synced = asyncio.Event()  # set once the first listing is applied
        self.health = self._watcher.health

    def current(self, port_id: str) -> tuple[PoolKey, Vif] | None:
        return self._ports.get(port_id)

    async def run(self, service: PoolService) -> None:
        async with contextlib.aclosing(self._watcher.batches()) as batches:
            async for batch in batches:
                self._apply(service, batch)
                self.synced.set()

    def _apply(self, service: PoolService, batch: WatchBatch) -> None:
        for event in batch.events:
            parsed = keys.parse_node_port_key(event.key)
            if parsed is not None:
                self._one(service, parsed[0], parsed[1], event)

    def _one(self, service: PoolService, node: str, port_id: str, event: WatchEvent) -> None:
        found = None
        if event.kind == "put":
            try:
                found = mirrored_vif(event.key, event.value)
            except ValidationError as exc:
                # Its state is unknown: it is not handed out until a value that parses comes.
                log.warning("controller.mirror.bad_value", key=event.key[:300], error=str(exc))
        if found is not None:
            self._ports[port_id] = found
            _port_seen(service.term.pools, *found)
            return
        known = self._ports.get(port_id)
        if known is not None and known[0].node == node:  # not a move's put that came first
            del self._ports[port_id]
            _port_gone(service.term.pools, port_id, node)


def _port_seen(pools: Pools, key: PoolKey, vif: Vif) -> None:
    """The mirror shows a port of ours bound (anew or changed): see ``Pools.seen``."""
    if pools.seen(key, vif):
        log.debug("pool.port_current", key=key, port=vif.port_id)


def _port_gone(pools: Pools, port_id: str, node: str) -> None:
    """The mirror no longer shows the port bound to ``node`` (deleted, unbound, moved):
    a free or recycling port of that node is forgotten; an in-use one stays its pod's
    until released (its agent learns of it from the same mirror)."""
    key = pools.pool_of(port_id) or pools.recyclable().get(port_id)
    if key is not None and key.node == node:
        pools.forget(port_id)
        log.info("pool.port_gone", key=key, port=port_id)
