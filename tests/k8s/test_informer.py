"""The informer's logic against a scripted API (the real apiserver: test_apiserver.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from podwire.backoff import Backoff
from podwire.errors import KubeApiError, KubeResourceExpired
from podwire.k8s.api import ListPage
from podwire.k8s.cache import Cache, Event
from podwire.k8s.informer import Informer
from podwire.k8s.objects import K8sNamespace, ObjectKey, read_namespace
from podwire.k8s.reach import ApiReach


def ns(name: str, version: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"u-{name}", "resourceVersion": version, "labels": labels}
    }


def line(kind: str, obj: Any) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


class ScriptedApi:
    """Lists answer from ``lists`` in turn; each watch plays the next script: a list of lines,
    or an exception to raise once the lines before it are sent."""

    def __init__(self, lists: list[ListPage], watches: list[list[Any]]) -> None:
        self.lists = lists
        self.watches = watches
        self.watched_from: list[str] = []

    async def list_page(self, kind: str, next_page: str | None = None) -> ListPage:
        return self.lists.pop(0)

    async def watch(
        self, kind: str, resource_version: str, seconds: int, opened: Any = None
    ) -> AsyncIterator[bytes]:
        self.watched_from.append(resource_version)
        if opened is not None:
            opened()
        if not self.watches:
            await asyncio.Event().wait()
        for item in self.watches.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item


def informer(api: ScriptedApi) -> tuple[Informer[K8sNamespace], list[Event[K8sNamespace]]]:
    events: list[Event[K8sNamespace]] = []
    cache: Cache[K8sNamespace] = Cache("namespaces", events.append)
    return Informer(api, cache, read_namespace, Backoff(0.001, 0.002)), events  # type: ignore[arg-type]


async def run_until(informer_: Informer[Any], done: Any) -> None:
    task = asyncio.create_task(informer_.run())
    try:
        async with asyncio.timeout(5):
            while not done():
                await asyncio.sleep(0.001)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_list_then_watch_from_the_lists_version_with_events_and_bookmarks() -> None:
    api = ScriptedApi(
        [ListPage([ns("a", "5")], "10", None)],
        [
            [
                line("ADDED", ns("b", "11")),
                line("MODIFIED", ns("a", "12", team="x")),
                line("BOOKMARK", {"metadata": {"resourceVersion": "20"}}),
            ],
            [line("DELETED", ns("b", "21"))],
        ],
    )
    watched, events = informer(api)
    await run_until(watched, lambda: len(api.watched_from) == 3)
    assert api.watched_from == ["10", "20", "21"]  # resumed from the bookmark, no relist
    assert watched.lists == 1
    assert [(e.type, e.key.name) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    assert events[2].previous is not None and events[2].previous.meta.labels == {}
    assert list(watched._cache.objects) == [ObjectKey("", "a")]


async def test_gone_relists_once_and_the_difference_becomes_events() -> None:
    api = ScriptedApi(
        [
            ListPage([ns("a", "1"), ns("b", "1")], "1", None),
            ListPage([ns("b", "1"), ns("c", "7")], "9", None),
        ],
        [[line("ADDED", ns("d", "2")), line("ERROR", {"code": 410, "message": "too old"})]],
    )
    watched, events = informer(api)
    await run_until(watched, lambda: len(api.watched_from) == 2)
    assert watched.lists == 2
    assert api.watched_from == ["1", "9"]
    assert [(e.type, e.key.name) for e in events[2:]] == [
        ("ADDED", "d"),
        ("DELETED", "a"),  # deleted while the watch was gone: still an event
        ("DELETED", "d"),
        ("ADDED", "c"),
    ]


async def test_gone_straight_after_a_list_waits_a_backoff_before_listing_again() -> None:
    gone = KubeResourceExpired("gone")
    api = ScriptedApi(
        [ListPage([], "1", None), ListPage([], "2", None)],
        [[gone]],
    )
    watched, _ = informer(api)
    await run_until(watched, lambda: len(api.watched_from) == 2)
    assert watched.lists == 2 and api.watched_from == ["1", "2"]


async def test_other_errors_resume_the_watch_without_a_relist() -> None:
    api = ScriptedApi(
        [ListPage([], "1", None)],
        [
            [line("ADDED", ns("a", "3")), KubeApiError("connection reset")],
            [line("ERROR", {"code": 500, "message": "internal"})],
        ],
    )
    watched, _ = informer(api)
    await run_until(watched, lambda: len(api.watched_from) == 3)
    assert watched.lists == 1
    assert api.watched_from == ["1", "3", "3"]


async def test_values_it_cannot_use_are_skipped_and_the_watch_goes_on() -> None:
    api = ScriptedApi(
        [ListPage([ns("Bad_Name", "1"), "junk", ns("a", "1")], "1", None)],
        [
            [
                b"not json",
                line("ADDED", {"metadata": {"name": "x"}}),
                json.dumps([1]).encode(),
                line("ADDED", ns("b", "4")),
            ]
        ],
    )
    watched, events = informer(api)
    await run_until(watched, lambda: len(api.watched_from) == 2)
    assert [e.key.name for e in events] == ["a", "b"]
    assert api.watched_from == ["1", "4"]


async def test_paged_lists_are_read_to_the_end() -> None:
    api = ScriptedApi(
        [ListPage([ns("a", "1")], "1", "next"), ListPage([ns("b", "1")], "8", None)], []
    )
    watched, events = informer(api)
    await run_until(watched, lambda: len(api.watched_from) == 1)
    assert [e.key.name for e in events] == ["a", "b"]
    assert api.watched_from == ["8"]


async def test_a_deleted_object_goes_even_when_its_last_state_is_unusable() -> None:
    broken = ns("a", "5")
    broken["metadata"]["labels"] = {"k": 1}
    api = ScriptedApi([ListPage([ns("a", "1")], "1", None)], [[line("DELETED", broken)]])
    watched, events = informer(api)
    await run_until(watched, lambda: len(api.watched_from) == 2)
    assert [(e.type, e.key.name) for e in events] == [("ADDED", "a"), ("DELETED", "a")]


async def test_an_unreachable_apiserver_is_said_once_and_its_return_once(caplog: Any) -> None:
    """Two informers failing over and over: one ``k8s.api.away`` naming the server and the
    error, one ``k8s.api.back`` once both were answered again; every failure is counted."""
    counted: list[None] = []
    reach = ApiReach("https://10.0.0.1:6443", on_error=lambda: counted.append(None))
    caplog.set_level(logging.INFO)
    for _ in range(3):
        reach.failed("pods", "list pods: ClientConnectorError: refused", 0.2)
        reach.failed("namespaces", "list namespaces: ClientConnectorError: refused", 0.2)
    assert reach.away and reach.problem is not None and "10.0.0.1:6443" in reach.problem
    reach.answered("pods")
    assert reach.away
    reach.answered("namespaces")
    reach.answered("networkpolicies")  # never failed: nothing to say
    assert not reach.away and reach.problem is None and reach.errors == len(counted) == 6
    lines = [(r.getMessage(), getattr(r, "fields", {})) for r in caplog.records]
    assert [m for m, _ in lines if m.startswith("k8s.api.")] == ["k8s.api.away", "k8s.api.back"]
    away = dict(lines)["k8s.api.away"]
    assert away["server"] == "https://10.0.0.1:6443" and "refused" in away["error"]


async def test_a_failing_informer_reports_to_the_reach_and_its_answer_clears_it() -> None:
    api = ScriptedApi([ListPage([], "1", None)], [[KubeApiError("connection reset")], []])
    cache: Cache[K8sNamespace] = Cache("namespaces")
    reach = ApiReach("https://apiserver")
    watched = Informer(api, cache, read_namespace, Backoff(0.001, 0.002), reach=reach)  # type: ignore[arg-type]
    await run_until(watched, lambda: len(api.watched_from) == 3)
    assert reach.errors == 1 and not reach.away and watched.listed.is_set()
