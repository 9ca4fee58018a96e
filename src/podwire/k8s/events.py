"""Kubernetes Events naming a failure on the object it concerns (a pod, a NetworkPolicy, a
namespace), so that ``kubectl describe`` shows why without anyone reading podwire's log.

Use: ``recorder.warn(ObjectRef.pod(ns, name, uid), "PortFailed", message)``; it never blocks
and never fails, and the leader's Kubernetes side runs ``recorder.run()`` to send them.

A failure that repeats (a pass retried every few seconds against a quota) must not become an
Event per attempt: the same object, reason and message is sent at once the first time, then
at most once per ``window`` with the count of the occurrences it stands for. Events are only
ever created, never patched (the controller's rights stay ``create``). A storm of distinct
failures is bounded twice: sends are paced by a token bucket, and at most ``MAX_KEYS``
distinct events are remembered; beyond that new ones are dropped and counted in the log."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from podwire.errors import KubeApiError
from podwire.log import get_logger

log = get_logger(__name__)

COMPONENT = "podwire-controller"
WINDOW = 600.0  # seconds between two Events of one object, reason and message
BURST = 20  # Events sent back to back after a quiet spell
PER_SECOND = 2.0  # then at most this many a second
MAX_KEYS = 4096
MAX_MESSAGE = 1024  # the apiserver refuses a message over 1 KiB in events.k8s.io


class EventSink(Protocol):
    def create_event(self, namespace: str, event: dict[str, Any]) -> Awaitable[None]: ...


@dataclass(frozen=True)
class ObjectRef:
    """The object an Event is about; ``namespace`` "" for a cluster-scoped kind."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def pod(cls, namespace: str, name: str, uid: str = "") -> ObjectRef:
        return cls("Pod", "v1", namespace, name, uid)

    @classmethod
    def of_namespace(cls, name: str, uid: str = "") -> ObjectRef:
        return cls("Namespace", "v1", "", name, uid)

    @classmethod
    def network_policy(cls, namespace: str, name: str, uid: str = "") -> ObjectRef:
        return cls("NetworkPolicy", "networking.k8s.io/v1", namespace, name, uid)


@dataclass(frozen=True)
class _EventKey:
    ref: ObjectRef
    type: str
    reason: str
    message: str


@dataclass
class _Pending:
    count: int  # occurrences not sent yet
    first: float  # wall-clock time of the first of them
    last: float
    sent: float | None = None  # monotonic time of the last send


class EventRecorder:
    def __init__(
        self,
        sink: EventSink,
        window: float = WINDOW,
        burst: int = BURST,
        per_second: float = PER_SECOND,
    ) -> None:
        self._sink = sink
        self._window = window
        self._burst = burst
        self._per_second = per_second
        self._tokens = float(burst)
        self._filled = time.monotonic()
        self._entries: dict[_EventKey, _Pending] = {}
        self._wake = asyncio.Event()
        self._instance = socket.gethostname()
        self.sent = 0
        self.dropped = 0

    def warn(self, ref: ObjectRef, reason: str, message: str) -> None:
        self.record(ref, "Warning", reason, message)

    def record(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        key = _EventKey(ref, type_, reason, message[:MAX_MESSAGE])
        now = time.time()
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= MAX_KEYS and not self._forget_old():
                self.dropped += 1
                log.warning("k8s.event.dropped", reason=reason, object=_named(ref))
                return
            entry = self._entries[key] = _Pending(0, now, now)
        if not entry.count:
            entry.first = now
        entry.count += 1
        entry.last = now
        self._wake.set()

    async def run(self) -> None:
        """Sends what is due, forever; the caller's cancellation ends it."""
        while True:
            due, wait = self._due()
            for key in due:
                await self._take_token()
                await self._send(key)
            if not due:
                self._wake.clear()
                try:
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                except TimeoutError:
                    pass

    def _due(self) -> tuple[list[_EventKey], float | None]:
        """The keys to send now, and how long until the next one is due (None: none is)."""
        now, due, wait = time.monotonic(), [], None
        for key, entry in self._entries.items():
            if not entry.count:
                continue
            at = 0.0 if entry.sent is None else entry.sent + self._window - now
            if at <= 0:
                due.append(key)
            else:
                wait = at if wait is None else min(wait, at)
        return due, wait

    async def _take_token(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._filled) * self._per_second)
        self._filled = now
        if self._tokens < 1:
            await asyncio.sleep((1 - self._tokens) / self._per_second)
            self._tokens, self._filled = 1.0, time.monotonic()
        self._tokens -= 1

    async def _send(self, key: _EventKey) -> None:
        entry = self._entries[key]
        body = self._event(key, entry)
        entry.count, entry.sent = 0, time.monotonic()
        try:
            await self._sink.create_event(body["metadata"]["namespace"], body)
        except KubeApiError as exc:  # best effort: the log line below says it all the same
            log.warning("k8s.event.failed", object=_named(key.ref), error=str(exc))
            return
        self.sent += 1

    def _event(self, key: _EventKey, entry: _Pending) -> dict[str, Any]:
        ref = key.ref
        namespace = ref.namespace or "default"  # where Events of cluster-scoped objects go
        involved = {"kind": ref.kind, "apiVersion": ref.api_version, "name": ref.name}
        if ref.namespace:
            involved["namespace"] = ref.namespace
        if ref.uid:
            involved["uid"] = ref.uid
        name = f"{ref.name[:200]}.{time.time_ns():x}"
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "type": key.type,
            "reason": key.reason,
            "message": key.message,
            "count": entry.count,
            "firstTimestamp": _stamp(entry.first),
            "lastTimestamp": _stamp(entry.last),
            "source": {"component": COMPONENT},
            "reportingComponent": f"podwire.io/{COMPONENT}",
            "reportingInstance": self._instance,
        }

    def _forget_old(self) -> bool:
        """Room for one more key: those sent over a window ago with nothing new go."""
        now = time.monotonic()
        old = [
            key
            for key, entry in self._entries.items()
            if not entry.count and entry.sent is not None and now - entry.sent >= self._window
        ]
        for key in old:
            del self._entries[key]
        return bool(old)


def _named(ref: ObjectRef) -> str:
    where = f"{ref.namespace}/" if ref.namespace else ""
    return f"{ref.kind} {where}{ref.name}"


def _stamp(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
