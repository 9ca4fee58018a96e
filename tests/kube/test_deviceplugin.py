"""The agent's memif device plugin meets the real kubelet of a kube-node: configured
beforehand for the node's kubelet dirs, it registers, and ``podwire.io/memif`` appears in the
Node's capacity and allocatable; a pod asking for one gets kubelet's Allocate answer (the
socket dir mounted, the environment set); after a kubelet restart the plugin registers again
(a second pod is allocated) and the first pod keeps its grant. On a node of 4 devices: a pod
asking for 5 is refused by kubelet (and by the scheduler) with no grant made; a deleted pod's
grant is released by the agent's pass over kubelet's PodResources API, a running pod's kept,
also by passes while kubelet restarts (and lists no pod at all for a moment)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from podwire.config import DevicePluginSettings
from podwire.deviceplugin import DevicePlugin
from podwire.deviceplugin.checkpoint import CheckpointStore
from podwire.deviceplugin.model import Allocation
from podwire.deviceplugin.podresources import PodResourcesClient
from podwire.errors import PodwireError
from podwire.kube.node import node_dir
from podwire.memif.master import is_running
from podwire.schema.checkpoints import memif_entry
from podwire.stack import procs
from tests.agent.harness import HostAgent
from tests.kube.conftest import Cluster, KubeNodeProcess, pod_manifest
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns]

RESOURCE = "podwire.io/memif"


def _settings(kubelet_root: Path, work: Path) -> DevicePluginSettings:
    return DevicePluginSettings(
        enabled=True,
        devices=4,
        device_plugins_dir=str(kubelet_root / "device-plugins"),
        pod_resources_socket=str(kubelet_root / "pod-resources" / "kubelet.sock"),
        memif_host_dir=str(work / "memif"),
        checkpoint=str(work / "memif-checkpoint.json"),
    )


def _kill_masters(state_root: Path) -> None:
    """memif masters outlive their agent by design: end this test's by pid."""
    for path in state_root.glob("*-state/memif-attachments.json"):
        for key, raw in json.loads(path.read_text())["memifs"].items():
            entry = memif_entry(key, raw)
            if is_running(entry.pid, entry.started):
                os.kill(entry.pid, 9)


async def test_the_memif_device_plugin_registers_with_the_real_kubelet(cluster: Cluster) -> None:
    host = cluster.host_name(4)
    kubelet_root = node_dir(Path(cluster.info["data_dir"]), host) / "kubelet"
    (kubelet_root / "device-plugins").mkdir(parents=True, exist_ok=True)
    work = cluster.work / host
    agent = await cluster.add_agent(4, deviceplugin=_settings(kubelet_root, work))
    node = await cluster.start_node(agent)
    try:

        async def advertised() -> bool:
            found = await cluster.kubectl.get("node", host)
            status = (found or {}).get("status", {})
            return status.get("capacity", {}).get(RESOURCE) == "4" and (
                status.get("allocatable", {}).get(RESOURCE) == "4"
            )

        await eventually(advertised, f"{RESOURCE} in {host}'s capacity and allocatable", 30)
        await _memif_pod(cluster, "pm", host)
        env = await cluster.exec("pm", "env")
        assert "MEMIF_SOCKET=/run/vpp/memif.sock" in env
        assert "memif.sock" in await cluster.exec("pm", "ls", "/run/vpp")

        await _restart_kubelet(kubelet_root.parent / "kubelet-config.json")
        await _memif_pod(cluster, "pm2", host)  # Allocate again: the plugin registered again
        assert "memif.sock" in await cluster.exec("pm", "ls", "/run/vpp")  # the grant stays
    finally:
        assert await cluster.retire(node) == 0
        for pod in ("pm", "pm2"):
            await cluster.delete_pod(pod, "--grace-period=0", "--force", "--ignore-not-found")
        _kill_masters(cluster.work)


def _memif_manifest(cluster: Cluster, name: str, host: str, count: int = 1) -> dict[str, Any]:
    manifest = pod_manifest(cluster, name, host)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE: str(count)}}
    return manifest


async def _memif_pod(cluster: Cluster, name: str, host: str) -> dict[str, Any]:
    manifest = _memif_manifest(cluster, name, host)
    await cluster.kubectl.run("apply", "-f", "-", stdin=json.dumps(manifest))
    return await cluster.running(name)


async def _restart_kubelet(config: Path) -> None:
    """SIGKILL to the node's kubelet; kube-node starts it again."""
    (old,) = procs.pids_marked(str(config))
    os.kill(old, signal.SIGKILL)

    async def restarted() -> bool:
        return [pid for pid in procs.pids_marked(str(config)) if pid != old] != []

    await eventually(restarted, "kube-node starting kubelet again", 30)


@dataclass
class MemifNode:
    """A node of its own whose agent serves 4 memif devices and releases a deleted pod's
    grant only through its pass over kubelet's PodResources API (the release a DEL schedules
    waits an hour here)."""

    host: str
    agent: HostAgent
    node: KubeNodeProcess
    settings: DevicePluginSettings

    def grants(self) -> dict[str, Allocation]:
        """The allocator's checkpoint, as the agent wrote it."""
        data = CheckpointStore(self.settings.checkpoint).load()
        return {a.id: a for a in data.allocations} if data else {}

    def plugin(self) -> DevicePlugin:
        """The agent's device plugin (the agent runs in this process)."""
        plugin = self.agent.agent.parts.plugin if self.agent.agent else None
        assert plugin is not None
        return plugin

    def allocate_calls(self) -> tuple[int, int]:
        """The plugin's counts of Allocate answers and refusals."""
        stats = self.plugin().stats()
        return stats.get("allocations", 0), stats.get("allocate_errors", 0)

    def host_dirs(self) -> set[str]:
        top = Path(self.settings.memif_host_dir)
        return {path.name for path in top.iterdir()} if top.is_dir() else set()


@pytest.fixture(scope="module")
async def memif_node(cluster: Cluster) -> AsyncIterator[MemifNode]:
    host = cluster.host_name(6)
    kubelet_root = node_dir(Path(cluster.info["data_dir"]), host) / "kubelet"
    (kubelet_root / "device-plugins").mkdir(parents=True, exist_ok=True)
    settings = _settings(kubelet_root, cluster.work / host)
    agent = await cluster.add_agent(6, deviceplugin=settings, pod_release_grace=3600.0)
    node = await cluster.start_node(agent)
    try:

        async def advertised() -> bool:
            found = await cluster.kubectl.get("node", host)
            return (found or {}).get("status", {}).get("allocatable", {}).get(RESOURCE) == "4"

        await eventually(advertised, f"{RESOURCE} in {host}'s allocatable", 30)
        yield MemifNode(host, agent, node, settings)
    finally:
        assert await cluster.retire(node) == 0
        _kill_masters(cluster.work)


async def _pod_events(cluster: Cluster, pod: str) -> list[tuple[str, str]]:
    selector = f"involvedObject.name={pod}"
    listed = json.loads(
        await cluster.kubectl.run(
            "get", "events", "-n", cluster.namespace, "--field-selector", selector, "-o", "json"
        )
    )
    return [(event["reason"], event["message"]) for event in listed["items"]]


async def test_a_pod_asking_for_more_memifs_than_the_node_has_is_refused(
    cluster: Cluster, memif_node: MemifNode
) -> None:
    host = memif_node.host
    grants, dirs, calls = memif_node.grants(), memif_node.host_dirs(), memif_node.allocate_calls()
    veths = cluster.pod_veths(host)
    placed = _memif_manifest(cluster, "pm5", host, 5)  # nodeName: straight to kubelet
    scheduled = _memif_manifest(cluster, "pm5s", "", 5)  # through the scheduler
    scheduled["spec"]["nodeSelector"] = {"kubernetes.io/hostname": host}
    try:
        for manifest in (placed, scheduled):
            await cluster.kubectl.run("apply", "-f", "-", stdin=json.dumps(manifest))
        seen: dict[str, Any] = {}

        async def refused() -> bool:
            pod = await cluster.kubectl.get("pod", "-n", cluster.namespace, "pm5")
            seen["status"] = (pod or {}).get("status", {})
            seen["events"] = await _pod_events(cluster, "pm5")
            seen["scheduler"] = await _pod_events(cluster, "pm5s")
            return seen["status"].get("phase") == "Failed" and any(
                reason == "FailedScheduling" for reason, _ in seen["scheduler"]
            )

        try:
            await eventually(refused, "pm5 refused by kubelet, pm5s by the scheduler", 60)
        finally:
            print(f"kubelet and scheduler: {seen}")
        status = seen["status"]
        assert status["reason"] == "UnexpectedAdmissionError"
        assert "Requested: 5, Available: 4" in status["message"]
        assert RESOURCE in status["message"]
        (_, scheduling), *_ = [e for e in seen["scheduler"] if e[0] == "FailedScheduling"]
        assert f"Insufficient {RESOURCE}" in scheduling
        pending = await cluster.kubectl.get("pod", "-n", cluster.namespace, "pm5s")
        assert pending is not None and pending["status"]["phase"] == "Pending"
        assert "nodeName" not in pending["spec"]
        assert memif_node.grants() == grants and memif_node.host_dirs() == dirs
        assert memif_node.allocate_calls() == calls  # kubelet refused without asking the plugin
        assert cluster.pod_veths(host) == veths
        for pod in ("pm5", "pm5s"):
            found = await cluster.kubectl.get("pod", "-n", cluster.namespace, pod)
            assert found is not None and await cluster.port_of(found["metadata"]["uid"]) is None
    finally:
        for pod in ("pm5", "pm5s"):
            await cluster.delete_pod(pod, "--grace-period=0", "--force", "--ignore-not-found")


async def test_kubelets_pod_resources_drive_the_release_of_a_deleted_pods_grant(
    cluster: Cluster, memif_node: MemifNode
) -> None:
    host = memif_node.host
    plugin = memif_node.plugin()
    grace, before = plugin.reconcile_grace, memif_node.grants()
    try:
        for name in ("pg1", "pg2"):
            await _memif_pod(cluster, name, host)
        made = {a.pod.name: a for a in memif_node.grants().values() if a.id not in before and a.pod}
        assert sorted(made) == ["pg1", "pg2"]
        gone, kept = made["pg1"].id, made["pg2"].id
        assert {gone, kept} <= memif_node.host_dirs()

        await cluster.delete_pod("pg1")
        await cluster.gone("pg1")
        assert gone in memif_node.grants()  # a DEL alone releases nothing before the hour

        # The agent's own pass, with its grace for grants kubelet has not recorded yet cut
        # from 60 s (DevicePlugin's, not a setting) so that pg1's counts as old.
        plugin.reconcile_grace = 0.0
        first = await plugin.reconcile()
        second = await plugin.reconcile()
        print(f"passes: {first}, {second}")
        assert gone not in memif_node.grants() and gone not in memif_node.host_dirs()
        assert kept in memif_node.grants() and kept in memif_node.host_dirs()
        assert (second.release, second.bind) == ((), {})  # pg2 is kubelet's: kept
        assert "memif.sock" in await cluster.exec("pg2", "ls", "/run/vpp")
    finally:
        plugin.reconcile_grace = grace
        for pod in ("pg1", "pg2"):
            await cluster.delete_pod(pod, "--grace-period=0", "--force", "--ignore-not-found")


async def test_a_running_pods_grant_survives_passes_during_a_kubelet_restart(
    cluster: Cluster, memif_node: MemifNode
) -> None:
    """A kubelet that has just started answers PodResources ``List`` with no pod at all until
    it has its pods from the apiserver (here for about 1 s): a pass then must not take that for
    every pod gone."""
    host, plugin = memif_node.host, memif_node.plugin()
    grace, before = plugin.reconcile_grace, memif_node.grants()
    config = node_dir(Path(cluster.info["data_dir"]), host) / "kubelet-config.json"
    try:
        await _memif_pod(cluster, "pk", host)
        (grant,) = [a for a in memif_node.grants().values() if a.id not in before]
        plugin.reconcile_grace = 0.0
        (old,) = procs.pids_marked(str(config))
        os.kill(old, signal.SIGKILL)
        seen: dict[str, int] = {}
        kubelet = PodResourcesClient(memif_node.settings.pod_resources_socket)

        async def listed_again() -> bool:  # a pass per poll, until kubelet lists pk's device
            try:
                decided = await plugin.reconcile()
            except PodwireError as exc:  # kubelet not serving yet, or not synced
                seen[type(exc).__name__] = seen.get(type(exc).__name__, 0) + 1
                return False
            seen["passes"] = seen.get("passes", 0) + 1
            seen["released"] = seen.get("released", 0) + len(decided.release)
            return set(grant.devices) <= set(await kubelet.assignments(RESOURCE))

        await eventually(listed_again, "the restarted kubelet listing pk's device", 60)
        print(f"passes while kubelet restarted: {seen}")
        assert [old] != procs.pids_marked(str(config))
        assert grant.id in memif_node.grants() and grant.id in memif_node.host_dirs()
        assert "memif.sock" in await cluster.exec("pk", "ls", "/run/vpp")
    finally:
        plugin.reconcile_grace = grace
        await cluster.delete_pod("pk", "--grace-period=0", "--force", "--ignore-not-found")
