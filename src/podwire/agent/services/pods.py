"""The Services in every pod of this node: follows ``/podwire/services/`` and keeps each pod's
``podwire_services`` table (``table.py``) equal to what its network may reach.

Each pod's table is changed only under that pod's lock, from what was last written into it
to what it should hold now, so the ADD that installs a new pod's table and a Service change
arriving meanwhile never undo each other. A pod whose table could not be written (its
namespace went: its DEL is coming) is written whole the next time. A value that does not
read is logged and treated as absent: its Service is unreachable rather than wrong."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from podwire import keys
from podwire.agent.services import table
from podwire.agent.services.table import PodService
from podwire.errors import PodwireError, ValidationError
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher, WatchBatch
from podwire.log import get_logger
from podwire.netfilter import Nftables
from podwire.schema.checkpoints import Attachment
from podwire.schema.services import ServiceEntry, read_service_entry

log = get_logger(__name__)


class PodServices:
    def __init__(self, etcd: EtcdClient, pods: Callable[[], Mapping[str, Attachment]]) -> None:
        """``pods``: this node's attachments by id (the agent's checkpoint)."""
        self.watcher = PrefixWatcher(etcd, keys.services_prefix())
        self._pods = pods
        self.entries: dict[str, ServiceEntry] = {}
        self._written: dict[str, dict[str, PodService]] = {}  # by attachment
        self._locks: dict[str, asyncio.Lock] = {}
        self.listed = asyncio.Event()

    async def run(self) -> None:
        async for batch in self.watcher.batches():
            self._take(batch)
            self.listed.set()
            await self.sync_all()

    def _take(self, batch: WatchBatch) -> None:
        for event in batch.events:
            if event.kind == "delete":
                self.entries.pop(event.key, None)
                continue
            if keys.parse_service_key(event.key) is None:
                log.warning("agent.services.bad_key", key=event.key)
                continue
            try:
                self.entries[event.key] = read_service_entry(event.value, event.key)
            except ValidationError as exc:
                log.warning("agent.services.bad_value", key=event.key, error=str(exc))
                self.entries.pop(event.key, None)

    async def sync_all(self) -> None:
        pods = dict(self._pods())
        for gone in self._written.keys() - pods.keys():
            del self._written[gone]
            self._locks.pop(gone, None)
        await asyncio.gather(*(self._sync_logged(pod) for pod in pods.values()))

    async def _sync_logged(self, pod: Attachment) -> None:
        try:
            await self.sync(pod)
        except PodwireError as exc:
            log.warning("agent.services.pod_failed", attachment=pod.attachment, error=str(exc))

    async def sync(self, pod: Attachment) -> None:
        """Bring one pod's table to what it should hold; raises when it could not be
        written (then written whole next time). The CNI ADD calls this before it answers,
        so a pod reaches its Services from its first connection."""
        lock = self._locks.setdefault(pod.attachment, asyncio.Lock())
        async with lock:
            wanted = self._wanted(pod.vif.network_id)
            written = self._written.get(pod.attachment)
            if written is None and not wanted:
                return  # no table until there is something to translate
            text = _text(written, wanted)
            if text:
                self._written.pop(pod.attachment, None)
                await _apply(pod.netns, text)
            self._written[pod.attachment] = wanted

    def forget(self, attachment: str) -> None:
        """The pod is gone (DEL): its namespace and table with it."""
        self._written.pop(attachment, None)
        self._locks.pop(attachment, None)

    def _wanted(self, network: str) -> dict[str, PodService]:
        return {key: table.for_network(entry, network) for key, entry in self.entries.items()}


def _text(written: dict[str, PodService] | None, wanted: dict[str, PodService]) -> str:
    if written is None:
        return table.whole(wanted)
    return "".join(
        table.changed(key, written.get(key), wanted.get(key))
        for key in sorted(written.keys() | wanted.keys())
    )


async def _apply(netns: str, text: str) -> None:
    nft = Nftables(netns)
    try:
        await nft.apply(text)
    finally:
        nft.close()
