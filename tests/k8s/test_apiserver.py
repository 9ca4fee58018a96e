"""The watcher against the real kube-apiserver of ``podwire stack up --kubernetes``: objects
made with kubectl reach the caches through one list and the watch, and compile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from podwire.errors import ConfigError
from podwire.k8s.api import KubeApi
from podwire.k8s.compile import compile_policies
from podwire.k8s.groups import OPEN_EGRESS, group_name, named_port_group_name
from podwire.k8s.objects import ObjectKey
from podwire.k8s.watcher import KubeWatcher
from podwire.kubeside.netpol_sync import NetpolReconciler
from podwire.neutron.client import neutron_connection
from podwire.neutron.netpol import NetpolObjects
from tests.k8s.objects import namespace_manifest, policy_manifest
from tests.stack.conftest import kubectl

pytestmark = [pytest.mark.stack, pytest.mark.slow]


async def apply(info: dict[str, Any], tmp_path: Path, *objects: dict[str, Any]) -> None:
    """Repeated while a new namespace has no default service account yet (the
    controller-manager makes it a moment after the namespace)."""
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))
    for _ in range(100):
        done = kubectl(info, "apply", "-f", str(path))
        if done.returncode == 0 or "serviceaccount" not in done.stderr:
            break
        await asyncio.sleep(0.2)
    assert done.returncode == 0, done.stderr


async def until(check: Callable[[], bool], seconds: float = 20) -> None:
    async with asyncio.timeout(seconds):
        while not check():
            await asyncio.sleep(0.05)


@pytest.fixture
async def watcher(kube_stack: dict[str, Any]) -> AsyncIterator[KubeWatcher]:
    api = await KubeApi.from_kubeconfig(Path(kube_stack["kubeconfig"]))
    watching = KubeWatcher(api)
    task = asyncio.create_task(watching.run())
    try:
        yield watching
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await api.close()


def pod(namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    container = {"name": "c", "image": "pause", "ports": [{"name": "http", "containerPort": 8080}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [container]},
    }


async def test_objects_reach_the_caches_and_compile(
    kube_stack: dict[str, Any], watcher: KubeWatcher, tmp_path: Path
) -> None:
    name = f"np-{uuid.uuid4().hex[:8]}"
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"team": "blue"}},
    }
    policy = policy_manifest(
        name,
        "deny",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
                {
                    "from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}],
                    "ports": [
                        {"port": "http"},
                        {"port": 9000, "endPort": 9010, "protocol": "SCTP"},
                    ],
                }
            ],
        },
    )
    try:
        await apply(kube_stack, tmp_path, namespace)
        await apply(kube_stack, tmp_path, pod(name, "web", {"app": "web"}), policy)
        await until(lambda: ObjectKey(name, "deny") in watcher.policies.objects)
        await until(lambda: ObjectKey(name, "web") in watcher.pods.objects)
        desired = compile_policies(watcher.cluster())
        group = desired.groups[group_name(ObjectKey(name, "deny"))]
        assert {(r.protocol, r.port_min, r.port_max) for r in group.rules} == {
            ("sctp", 9000, 9010),
        }
        # The named port as the pod gives it, in the group of that meaning.
        named = desired.groups[
            named_port_group_name(ObjectKey(name, "deny"), (("http", "TCP", 8080),))
        ]
        assert {(r.protocol, r.port_min, r.port_max) for r in named.rules} == {("tcp", 8080, 8080)}
        assert desired.pods[ObjectKey(name, "web")].groups == {
            group.name,
            named.name,
            OPEN_EGRESS,
        }

        done = kubectl(kube_stack, "label", "pod", "-n", name, "web", "app=other", "--overwrite")
        assert done.returncode == 0, done.stderr
        await until(
            lambda: watcher.pods.objects[ObjectKey(name, "web")].meta.labels["app"] == "other"
        )
        assert (
            OPEN_EGRESS in compile_policies(watcher.cluster()).pods[ObjectKey(name, "web")].groups
        )
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
    await until(lambda: ObjectKey(name, "deny") not in watcher.policies.objects, 60)
    no_relist = [1] * len(watcher.informers)
    assert [informer.lists for informer in watcher.informers] == no_relist


async def test_a_policy_made_with_kubectl_reaches_neutron_and_leaves_with_it(
    kube_stack: dict[str, Any], watcher: KubeWatcher, tmp_path: Path
) -> None:
    """The whole path on the stack's own apiserver and Neutron: kubectl -> informer ->
    compiler -> reconciler -> a tagged security group; deleted with the policy."""
    name = f"np-{uuid.uuid4().hex[:8]}"
    objects = NetpolObjects(
        neutron_connection(kube_stack["neutron"]), uuid.uuid4().hex, name, "podwire-"
    )
    reconciler = asyncio.create_task(
        NetpolReconciler(watcher.cluster, objects).run(watcher.changed)
    )
    group = group_name(ObjectKey(name, "deny"))
    namespace = namespace_manifest(name)
    policy = policy_manifest(
        name, "deny", {"podSelector": {}, "ingress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}
    )

    async def neutron_groups() -> dict[str, Any]:
        return {g.name: g for g in await asyncio.to_thread(objects.groups)}

    try:
        await apply(kube_stack, tmp_path, namespace, policy)
        wanted = {("udp", 53, 53, "ingress")}
        async with asyncio.timeout(30):  # created, Neutron's defaults gone, its rules in
            while _rules(await neutron_groups(), group) != wanted:
                await asyncio.sleep(0.1)
        kubectl(kube_stack, "delete", "networkpolicy", "-n", name, "deny")
        async with asyncio.timeout(30):
            while group in await neutron_groups():
                await asyncio.sleep(0.1)
    finally:
        reconciler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reconciler
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
        for leftover in objects.groups():
            objects.delete_group(leftover.id)


def _rules(groups: dict[str, Any], name: str) -> set[tuple[Any, ...]] | None:
    if name not in groups:
        return None
    return {(r.protocol, r.port_min, r.port_max, r.direction) for r in groups[name].rules}


async def test_watches_the_apiserver_ends_resume_without_a_relist(
    kube_stack: dict[str, Any], tmp_path: Path
) -> None:
    """Watch requests of 1 s: each ends and the next resumes from the last version (the
    bookmarks' or an event's), and an object made after several of them still arrives."""
    api = await KubeApi.from_kubeconfig(Path(kube_stack["kubeconfig"]))
    watching = KubeWatcher(api, watch_seconds=1)
    task = asyncio.create_task(watching.run())
    name = f"np-{uuid.uuid4().hex[:8]}"
    try:
        await until(lambda: all(i.version is not None for i in watching.informers))
        await asyncio.sleep(3.5)
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
        )
        await until(lambda: ObjectKey("", name) in watching.namespaces.objects)
        assert [informer.lists for informer in watching.informers] == [1] * len(watching.informers)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


async def test_a_missing_kubeconfig_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kubeconfig"):
        await KubeApi.from_kubeconfig(tmp_path / "missing")
