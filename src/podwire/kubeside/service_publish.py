"""The leader's Services for the agents: every ClusterIP Service, compiled with its ready
endpoints (``k8s.services``), as one etcd value each under ``/podwire/services/``.

A pass compiles every Service from the informers' caches and writes only the values whose
bytes changed, in fenced transactions (a term that ended writes nothing): an endpoint change
is one value, whatever the number of Services. Each term starts by reading what the prefix
holds, so a value left by an earlier term for a Service deleted meanwhile is deleted, and
only values podwire wrote are ever touched (the prefix is podwire's alone)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from podwire import keys
from podwire.backoff import Backoff, passes_on_wake
from podwire.errors import NotLeader, PodwireError
from podwire.etcd.client import MAX_TXN_OPS, Compare, EtcdClient, delete_op, put_op
from podwire.k8s.objects import ObjectKey
from podwire.k8s.services import EndpointSlice, compile_service
from podwire.k8s.watcher import KubeWatcher
from podwire.log import get_logger

log = get_logger(__name__)


class ServicePublisher:
    def __init__(self, etcd: EtcdClient, fence: Callable[[], Sequence[Compare]]) -> None:
        self._etcd = etcd
        self._fence = fence
        self._written: dict[str, bytes] | None = None  # what the prefix holds, as last seen
        self._backoff = Backoff(0.2, 10.0)

    async def run(self, watcher: KubeWatcher) -> None:
        """A pass at once, then after every change of a Service, an EndpointSlice or a pod;
        a failed pass again after a backoff or the next change (rereading the prefix). A
        term that ended is not retried: it ends this side."""

        async def one_pass() -> None:
            await self.sync(watcher)

        def retry(exc: PodwireError, delay: float) -> None:
            if isinstance(exc, NotLeader):
                raise exc
            self._written = None
            log.warning("controller.services.retry", error=str(exc), delay=delay)

        await passes_on_wake(one_pass, watcher.services_changed, self._backoff, retry)

    async def sync(self, watcher: KubeWatcher) -> int:
        """One pass; returns how many values it wrote or deleted."""
        wanted = self.compiled(watcher)
        written = self._written
        if written is None:
            found, _ = await self._etcd.get_prefix(keys.services_prefix())
            written = {kv.key: kv.value for kv in found}
        ops = [put_op(key, value) for key, value in wanted.items() if written.get(key) != value]
        ops += [delete_op(key) for key in written.keys() - wanted.keys()]
        for start in range(0, len(ops), MAX_TXN_OPS):
            held, _ = await self._etcd.txn(self._fence(), ops[start : start + MAX_TXN_OPS])
            if not held:
                raise NotLeader("leadership lost while publishing Services")
        self._written = wanted
        if ops:
            log.info("controller.services.published", changed=len(ops), services=len(wanted))
        return len(ops)

    @staticmethod
    def compiled(watcher: KubeWatcher) -> dict[str, bytes]:
        slices: dict[ObjectKey, list[EndpointSlice]] = {}
        for piece in watcher.slices.objects.values():
            if piece.service is not None:
                slices.setdefault(piece.service, []).append(piece)
        pods = watcher.pods.objects
        wanted = {}
        for key, service in watcher.services.objects.items():
            entry = compile_service(service, slices.get(key, []), pods)
            if entry is not None:
                wanted[keys.service(key.namespace, key.name)] = entry.encode()
        return wanted
