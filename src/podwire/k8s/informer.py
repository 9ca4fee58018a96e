"""One kind of the Kubernetes API followed as client-go's informers do.

List, then watch from the list's resourceVersion with bookmarks, so an idle watch still
moves its version forward and a reconnect resumes without a relist. Only a 410 Gone (the
version is no longer kept) relists, once; any other error waits through ``Backoff`` and
resumes the watch from the last version seen. There is no periodic relist: after the first
list, the apiserver's events are the only traffic."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic

from podwire.backoff import Backoff
from podwire.errors import KubeApiError, KubeResourceExpired, ValidationError
from podwire.k8s.api import MAX_LINE, KubeApi
from podwire.k8s.cache import ADDED, DELETED, MODIFIED, Cache, T
from podwire.k8s.objects import ObjectKey
from podwire.k8s.reach import ApiReach
from podwire.log import get_logger
from podwire.schema import doc

log = get_logger(__name__)

WATCH_SECONDS = 300
Reader = Callable[[Any], T]


class Informer(Generic[T]):
    def __init__(
        self,
        api: KubeApi,
        cache: Cache[T],
        read: Reader[T],
        backoff: Backoff | None = None,
        watch_seconds: int = WATCH_SECONDS,
        reach: ApiReach | None = None,
    ) -> None:
        self._api = api
        self._reach = reach or ApiReach(getattr(api, "server", "the Kubernetes API"))
        self._cache = cache
        self._read = read
        self._backoff = backoff or Backoff(0.2, 10.0)
        self._watch_seconds = watch_seconds
        self.version: str | None = None
        self.lists = 0  # how many times this informer listed: once, plus once per 410
        self.listed = asyncio.Event()  # set by the first list: the cache holds the API's state

    @property
    def kind(self) -> str:
        return self._cache.kind

    async def run(self) -> None:
        """Forever; the caller's cancellation ends it."""
        while True:
            try:
                await self.step()
            except KubeApiError as exc:
                delay = self._backoff.next()
                self._reach.failed(self.kind, str(exc), delay)
                await asyncio.sleep(delay)

    async def step(self) -> None:
        """One list (if needed) and one watch request to its end."""
        listed_now = self.version is None
        if listed_now:
            await self.relist()
        try:
            await self.watch_once()
        except KubeResourceExpired as exc:
            log.info("k8s.watch.expired", kind=self.kind, version=self.version, error=str(exc))
            self.version = None
            if listed_now:
                raise  # expired straight after a list: listed again after a backoff
            await self.relist()
        self._backoff.reset()

    async def relist(self) -> None:
        found: dict[Any, T] = {}
        page: str | None = None
        while True:
            answer = await self._api.list_page(self.kind, page)
            for raw in answer.items:
                value = self._value(raw)
                if value is not None:
                    found[value.meta.key] = value
            if answer.next_page is None:
                break
            page = answer.next_page
        self._cache.replace(found)
        self.version = answer.resource_version
        self.lists += 1
        self.listed.set()
        self._answered()
        log.info(  # lists: 1, then one more per 410 Gone (no periodic relist)
            "k8s.listed", kind=self.kind, objects=len(found), version=self.version, lists=self.lists
        )

    async def watch_once(self) -> None:
        assert self.version is not None
        async for line in self._api.watch(
            self.kind, self.version, self._watch_seconds, self._answered
        ):
            self._event(line)

    def _answered(self) -> None:
        """The apiserver took a list or a watch: the next failure is a new outage, retried
        after the shortest delay again, not after the one the last outage had reached."""
        self._backoff.reset()
        self._reach.answered(self.kind)

    def _event(self, line: bytes) -> None:
        try:
            event = doc.as_object(doc.decode(line, f"{self.kind} event", MAX_LINE), "event")
        except ValidationError as exc:
            log.warning("k8s.event.skipped", kind=self.kind, error=str(exc))
            return
        kind, raw = event.get("type"), event.get("object")
        if kind == "ERROR":
            _raise_status(self.kind, raw)
        version = _version(raw)
        if kind in (ADDED, MODIFIED, DELETED):
            self._apply(kind, raw)
        if version is not None:  # BOOKMARK: only the version moves
            self.version = version

    def _apply(self, kind: str, raw: Any) -> None:
        value = self._value(raw)
        if kind == DELETED:
            # A deleted object goes even if its last state is unusable: only its key counts.
            key = value.meta.key if value is not None else _key(raw)
            if key is not None:
                self._cache.remove(key)
        elif value is not None:
            self._cache.put(value)

    def _value(self, raw: Any) -> T | None:
        """A value podwire cannot use is logged and skipped: it never stops the watch."""
        try:
            return self._read(raw)
        except ValidationError as exc:
            log.warning("k8s.object.skipped", kind=self.kind, error=str(exc))
            return None


def _key(raw: Any) -> ObjectKey | None:
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    if not isinstance(meta, dict):
        return None
    name, namespace = meta.get("name"), meta.get("namespace", "")
    if isinstance(name, str) and isinstance(namespace, str):
        return ObjectKey(namespace, name)
    return None


def _version(raw: Any) -> str | None:
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return version if isinstance(version, str) and version else None


def _raise_status(kind: str, status: Any) -> None:
    body = status if isinstance(status, dict) else {}
    message = f"watch {kind}: {body.get('code')} {body.get('message', 'error event')}"
    if body.get("code") == 410:
        raise KubeResourceExpired(message)
    raise KubeApiError(message)
