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
from dataclasses import dataclass, field

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
        # What each network's pods should hold, kept per change: a change costs its own
        # Service, never a pass over every Service.
        self._views: dict[str, dict[str, PodService]] = {}
        self._tables: dict[str, _PodTable] = {}  # by attachment: what each holds
        self._locks: dict[str, asyncio.Lock] = {}

    async def run(self) -> None:
        async for batch in self.watcher.batches():
            changed = self._take(batch)
            await self.sync_all(changed)

    def _take(self, batch: WatchBatch) -> set[str]:
        """The batch into ``entries`` and the views; returns the keys it changed."""
        changed = set()
        for event in batch.events:
            changed.add(event.key)
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
        for network, view in self._views.items():
            for key in changed:
                entry = self.entries.get(key)
                if entry is None:
                    view.pop(key, None)
                else:
                    view[key] = table.for_network(entry, network)
        return changed

    async def sync_all(self, changed: set[str]) -> None:
        pods = dict(self._pods())
        for gone in self._tables.keys() - pods.keys():
            self.forget(gone)
        networks = {pod.vif.network_id for pod in pods.values()}
        for unused in self._views.keys() - networks:
            del self._views[unused]
        await asyncio.gather(*(self._sync_logged(pod, changed) for pod in pods.values()))

    async def _sync_logged(self, pod: Attachment, changed: set[str]) -> None:
        try:
            await self.sync(pod, changed)
        except PodwireError as exc:
            log.warning("agent.services.pod_failed", attachment=pod.attachment, error=str(exc))

    async def sync(self, pod: Attachment, changed: set[str] | None = None) -> None:
        """Bring one pod's table to what it should hold (``changed``: only these Services
        may differ from what it holds; None: any); raises when it could not be written
        (then it is written whole next time). The CNI ADD calls this before it answers, so
        a pod reaches its Services from its first connection."""
        lock = self._locks.setdefault(pod.attachment, asyncio.Lock())
        async with lock:
            view = self._view(pod.vif.network_id)
            held = self._tables.get(pod.attachment)
            if held is None:
                if view:  # no table until there is something to translate
                    await self._write_whole(pod, _PodTable(Nftables(pod.netns)), view)
                return
            names = sorted(held.services.keys() | view.keys() if changed is None else changed)
            for name in names:
                before, after = held.services.get(name), view.get(name)
                text = table.changed(before, after, held.chains)
                if text is None:  # a picking chain the table lacks
                    await self._write_whole(pod, held, view)
                    return
                await self._write(pod, held, text)
                if after is None:
                    held.services.pop(name, None)
                else:
                    held.services[name] = after

    async def _write_whole(
        self, pod: Attachment, held: _PodTable, view: dict[str, PodService]
    ) -> None:
        await self._write(pod, held, table.whole(view))
        held.services, held.chains = dict(view), table.chains(view) | table.MADE_AHEAD
        self._tables[pod.attachment] = held

    async def _write(self, pod: Attachment, held: _PodTable, text: str) -> None:
        if not text:
            return
        try:
            await held.nft.apply(text)
        except BaseException:
            # What the table holds is unknown now: it is written whole next time.
            if self._tables.get(pod.attachment) is held:
                self.forget(pod.attachment)
            else:
                held.nft.close()
            raise

    def _view(self, network: str) -> dict[str, PodService]:
        view = self._views.get(network)
        if view is None:
            view = {k: table.for_network(e, network) for k, e in self.entries.items()}
            self._views[network] = view
        return view

    def forget(self, attachment: str) -> None:
        """The pod is gone (DEL): its namespace and table with it."""
        held = self._tables.pop(attachment, None)
        if held is not None:
            held.nft.close()
        self._locks.pop(attachment, None)

    def close(self) -> None:
        for attachment in list(self._tables):
            self.forget(attachment)


@dataclass
class _PodTable:
    """One pod's table as written, and the libnftables context in its namespace, kept:
    a new context costs ~20 ms, a change through a kept one well under a millisecond."""

    nft: Nftables
    services: dict[str, PodService] = field(default_factory=dict)
    chains: set[str] = field(default_factory=set)
