"""The agent's memif device plugin meets the real kubelet of a kube-node: configured
beforehand for the node's kubelet dirs, it registers, and ``podwire.io/memif`` appears in the
Node's capacity and allocatable; a pod asking for one gets kubelet's Allocate answer (the
socket dir mounted, the environment set); after a kubelet restart the plugin registers again
(a second pod is allocated) and the first pod keeps its grant."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from podwire.agent.memif_master import is_running
from podwire.config import DevicePluginSettings
from podwire.kube.node import node_dir
from podwire.schema.checkpoints import memif_entry
from podwire.stack import procs
from tests.kube.conftest import Cluster, pod_manifest
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


async def _memif_pod(cluster: Cluster, name: str, host: str) -> None:
    manifest = pod_manifest(cluster, name, host)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE: "1"}}
    await cluster.kubectl.run("apply", "-f", "-", stdin=json.dumps(manifest))
    await cluster.running(name)


async def _restart_kubelet(config: Path) -> None:
    """SIGKILL to the node's kubelet; kube-node starts it again."""
    (old,) = procs.pids_marked(str(config))
    os.kill(old, signal.SIGKILL)

    async def restarted() -> bool:
        return [pid for pid in procs.pids_marked(str(config)) if pid != old] != []

    await eventually(restarted, "kube-node starting kubelet again", 30)
