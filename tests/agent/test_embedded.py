"""The agent process's extras: its ops endpoint, and the device plugin running inside it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import aiohttp

from podwire.config import EtcdSettings
from podwire.deviceplugin.kubelet_peer import KubeletPeer
from podwire.stack.netutil import free_port
from tests.agent.harness import HostAgent
from tests.agent.netenv import NetEnv
from tests.deviceplugin.conftest import make_settings


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
