"""The Event recorder against the kube stack's real apiserver: a failure reported many times
is one Event carrying its count, a repeat after the window is a second one with the count of
what came meanwhile, and a storm of distinct failures is paced (the rest waits, none is
lost below the key bound)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from podwire.k8s.api import KubeApi
from podwire.k8s.events import EventRecorder, ObjectRef
from tests.k8s.objects import namespace_manifest
from tests.k8s.test_apiserver import apply, pod
from tests.k8s.test_leader_kubernetes import uid_of
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl

pytestmark = [pytest.mark.stack, pytest.mark.slow]


@pytest.fixture
async def api(kube_stack: dict[str, Any]) -> AsyncIterator[KubeApi]:
    made = await KubeApi.from_kubeconfig(Path(kube_stack["kubeconfig"]))
    yield made
    await made.close()


@pytest.fixture
async def namespace(kube_stack: dict[str, Any], tmp_path: Path) -> AsyncIterator[str]:
    name = f"ev-{uuid.uuid4().hex[:8]}"
    await apply(
        kube_stack,
        tmp_path,
        namespace_manifest(name),
        pod(name, "web", {"app": "web"}),
    )
    yield name
    kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


def events_of(kube_stack: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    done = kubectl(kube_stack, "get", "events", "-n", namespace, "-o", "json")
    assert done.returncode == 0, done.stderr
    return [e for e in json.loads(done.stdout)["items"] if e.get("source", {}).get("component")]


@contextlib.asynccontextmanager
async def running(recorder: EventRecorder) -> AsyncIterator[None]:
    task = asyncio.create_task(recorder.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_repeated_failure_is_one_event_with_its_count(
    kube_stack: dict[str, Any], api: KubeApi, namespace: str
) -> None:
    uid = uid_of(kube_stack, namespace, "web")
    ref = ObjectRef.pod(namespace, "web", uid)
    recorder = EventRecorder(api, window=2.0)
    async with running(recorder):
        recorder.warn(ref, "PortFailed", "quota exceeded for ports")
        await eventually(lambda: _sent(recorder, 1), "the first Event sent", 20)
        for _ in range(5):  # within the window: held, counted
            recorder.warn(ref, "PortFailed", "quota exceeded for ports")
        recorder.warn(ref, "PortFailed", "another cause")  # another message: its own Event
        await eventually(lambda: _sent(recorder, 3), "the held Events sent", 20)

    found = events_of(kube_stack, namespace)
    counts = sorted((e["message"], e["count"]) for e in found if e["reason"] == "PortFailed")
    assert counts == [
        ("another cause", 1),
        ("quota exceeded for ports", 1),
        ("quota exceeded for ports", 5),
    ]
    for event in found:
        assert event["type"] == "Warning"
        assert event["involvedObject"]["uid"] == uid
        assert event["involvedObject"]["kind"] == "Pod"
        assert event["source"]["component"] == "podwire-controller"


async def test_a_storm_of_distinct_failures_is_paced(
    kube_stack: dict[str, Any], api: KubeApi, namespace: str
) -> None:
    recorder = EventRecorder(api, burst=3, per_second=4.0)
    ref = ObjectRef.pod(namespace, "web")
    started = time.monotonic()
    async with running(recorder):
        for number in range(11):
            recorder.warn(ref, "PortFailed", f"failure {number}")
        await eventually(lambda: _sent(recorder, 11), "all eleven sent", 30)
    # 3 at once, then 8 at 4 a second: no faster than 2 s (the pace, not a timing limit)
    assert time.monotonic() - started >= 1.9
    messages = {e["message"] for e in events_of(kube_stack, namespace)}
    assert messages == {f"failure {number}" for number in range(11)}


async def _sent(recorder: EventRecorder, count: int) -> bool:
    return recorder.sent >= count
