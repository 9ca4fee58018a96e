"""The in-memory copy of one kind, kept by its informer, and the typed events it emits.

A relist is applied as the difference to what was cached, so an object deleted while the
watch was broken still ends in a DELETED event: listeners never need a relist of their own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from podwire.k8s.objects import Meta, ObjectKey

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"


class Cached(Protocol):
    @property
    def meta(self) -> Meta: ...


T = TypeVar("T", bound=Cached)


@dataclass(frozen=True)
class Event(Generic[T]):
    """``previous`` is what the cache held before (None for ADDED), ``current`` what it holds
    now (None for DELETED): a listener sees label moves without keeping copies."""

    kind: str
    type: str
    key: ObjectKey
    previous: T | None
    current: T | None


Listener = Callable[[Event[T]], None]


class Cache(Generic[T]):
    def __init__(self, kind: str, listener: Listener[T] | None = None) -> None:
        self.kind = kind
        self._objects: dict[ObjectKey, T] = {}
        self._listener = listener

    @property
    def objects(self) -> Mapping[ObjectKey, T]:
        return self._objects

    def put(self, value: T) -> None:
        previous = self._objects.get(value.meta.key)
        if previous is not None and previous.meta.resource_version == value.meta.resource_version:
            return
        self._objects[value.meta.key] = value
        self._emit(MODIFIED if previous is not None else ADDED, value.meta.key, previous, value)

    def remove(self, key: ObjectKey) -> None:
        previous = self._objects.pop(key, None)
        if previous is not None:
            self._emit(DELETED, key, previous, None)

    def replace(self, values: Mapping[ObjectKey, T]) -> None:
        for key in [key for key in self._objects if key not in values]:
            self.remove(key)
        for value in values.values():
            self.put(value)

    def _emit(self, type_: str, key: ObjectKey, previous: T | None, current: T | None) -> None:
        if self._listener is not None:
            self._listener(Event(self.kind, type_, key, previous, current))
