"""The agent process's extras: its ops endpoint, and the device plugin running inside it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire.config import EtcdSettings
from podwire.stack.netutil import free_port
from tests.agent.harness import HostAgent, acni, plugin_binary
from tests.agent.netenv import NetEnv
from tests.deviceplugin.conftest import make_settings
from tests.kubelet_peer import KubeletPeer
from tests.scripted_agent import eventually


async def test_ops_endpoint_and_embedded_device_plugin(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
) -> None:
    short_root = Path(tempfile.mkdtemp(prefix="pw-dp-", dir="/tmp"))  # unix socket length
    kubelet = KubeletPeer(short_root, "podwire.io/memif")
    await kubelet.start()
    await kubelet.start_pod_resources()
    ns, vtep = netenv.host(1)
    port = free_port()
    agent = HostAgent(
        hostnames[0],
        ns,
        vtep,
        tmp_path,
        etcd_settings,
        neutron_endpoint,
        ops_listen=f"127.0.0.1:{port}",
        deviceplugin=make_settings(short_root, devices=3),
    )
    try:
        await agent.start()
        event = await kubelet.register_events.get()
        assert event.request.resource_name == "podwire.io/memif"
        assert len(await kubelet.wait_devices(lambda devices: len(devices) == 3)) == 3
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/healthz") as response:
                assert response.status == 200
            async with http.get(base + "/readyz") as response:
                assert response.status == 200, await response.text()
            async with http.get(base + "/metrics") as response:
                text = await response.text()
                assert "podwire_agent_" in text
        # This agent's own registry: its counters (no port is desired on this new host, so it
        # wired none: a registry shared with other agents would count theirs), and the
        # embedded plugin's figures.
        samples = _samples(text)
        assert samples["podwire_agent_ports_wired_total"] == 0
        assert samples["podwire_deviceplugin_devices"] == 3
        assert samples["podwire_deviceplugin_registered"] == 1
        assert samples["podwire_deviceplugin_registrations_total"] >= 1
    finally:
        await agent.stop()
        await kubelet.stop()
        shutil.rmtree(short_root, ignore_errors=True)


def _samples(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text exposition, by name."""
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line and not line.startswith("#") and "{" not in name:
            found[name] = float(value)
    return found


@pytest.mark.slow
async def test_device_plugin_failures_never_stop_cni(
    netenv: NetEnv,
    hostnames: list[str],
    etcd_settings: EtcdSettings,
    neutron_endpoint: str,
    tmp_path: Path,
) -> None:
    """No kubelet directory at start, a refused registration, the directory removed under a
    running agent: CNI keeps serving, readiness stays ready and names the device plugin's
    problem, and the plugin registers once kubelet is back."""
    short_root = Path(tempfile.mkdtemp(prefix="pw-dp-", dir="/tmp"))
    ns, vtep = netenv.host(1)
    port = free_port()
    agent = HostAgent(
        hostnames[0], ns, vtep, tmp_path, etcd_settings, neutron_endpoint,
        ops_listen=f"127.0.0.1:{port}", deviceplugin=make_settings(short_root, devices=2),
    )  # fmt: skip
    conf = agent.conf("unused")
    kubelet: KubeletPeer | None = None
    try:
        await agent.start()  # kubelet's device-plugins dir does not exist yet
        status = await acni(plugin_binary("c", tmp_path), "STATUS", conf)
        assert status.code == 0, status.stdout
        ready = await _readyz(port)
        assert ready[0] == 200 and "device plugin" in ready[1] and "does not exist" in ready[1]

        kubelet = KubeletPeer(short_root, "podwire.io/memif")  # makes kubelet's directories
        kubelet.reject_with = "kubelet says no"
        await kubelet.start()

        async def refused() -> bool:
            status, text = await _readyz(port)
            return status == 200 and "kubelet says no" in text

        await eventually(refused, "the refusal named in readiness", 60)
        assert (await acni(plugin_binary("c", tmp_path), "STATUS", conf)).code == 0
        kubelet.reject_with = None
        await kubelet.register_events.get()  # retried with backoff, accepted
        await eventually(_async(lambda: _readyz(port)), "ready with nothing aside", 60)

        shutil.rmtree(short_root / "device-plugins")  # kubelet's directory gone
        status = await acni(plugin_binary("c", tmp_path), "STATUS", conf)
        assert status.code == 0, status.stdout
        assert agent.task is not None and not agent.task.done()
    finally:
        await agent.stop()
        if kubelet is not None:
            await kubelet.stop()
        shutil.rmtree(short_root, ignore_errors=True)


async def _readyz(port: int) -> tuple[int, str]:
    url = f"http://127.0.0.1:{port}/readyz"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.text()


def _async(probe: Any) -> Any:
    async def ready_without_problems() -> bool:
        status, text = await probe()
        return status == 200 and "device plugin" not in text

    return ready_without_problems
