"""A memif CNF through Kubernetes: a pod asking kubelet for ``podwire.io/memif`` gets its grant
from kubelet's Allocate (the agent's device plugin), its memif from the CNI ADD, and DPDK's
testpmd in the pod (the node's imported CNF image) answers pings from a pod on the other host
over that memif. Deleting the pod releases the grant (the release driven by kubelet's
PodResources alone is tests/kube/test_deviceplugin.py's)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from podwire.kube import cnf, manifests
from podwire.kube.node import node_dir
from tests.kube.conftest import Cluster
from tests.kube.test_deviceplugin import _kill_masters, _settings
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns]


def _memif_info(memif_dir: Path) -> dict[str, object] | None:
    found = sorted(memif_dir.glob("*/memif.json"))
    return json.loads(found[0].read_text()) if found else None


async def test_a_testpmd_cnf_pod_answers_over_its_memif(cluster: Cluster) -> None:
    if not cnf.available():
        pytest.skip("dpdk-testpmd or DPDK's memif PMD is not installed (Debian dpdk-dev)")
    host, peer = cluster.host_name(0), cluster.hosts[1]
    kubelet_root = node_dir(Path(cluster.info["data_dir"]), host) / "kubelet"
    (kubelet_root / "device-plugins").mkdir(parents=True, exist_ok=True)
    work = cluster.work / host
    agent = await cluster.add_agent(0, deviceplugin=_settings(kubelet_root, work))
    node = await cluster.start_node(agent)
    try:
        manifest = manifests.testpmd_pod("cnf", cluster.namespace, host)
        await cluster.kubectl.run("apply", "-f", "-", stdin=json.dumps(manifest))
        await cluster.create_pod("cnf-client", peer)
        await cluster.running("cnf")
        await cluster.running("cnf-client")
        info = _memif_info(work / "memif")
        assert info is not None, "no memif.json in the pod's grant dir"
        address = str(info["ips"][0]).split("/")[0]  # type: ignore[index]
        port = await asyncio.to_thread(cluster.neutron.network.get_port, str(info["port_id"]))
        assert port.binding_host_id == host
        last = [""]

        async def answered() -> bool:
            ping = ("ping", "-c", "1", "-W", "1", address)
            last[0] = await cluster.exec("cnf-client", *ping, check=False)
            return " 0% packet loss" in last[0]

        try:
            await eventually(answered, f"testpmd in the CNF pod answering on {address}", 30)
        except AssertionError as exc:
            logs = await cluster.kubectl.run("logs", "-n", cluster.namespace, "cnf", check=False)
            raise AssertionError(f"{exc}; last ping {last[0]!r}; testpmd: {logs[-1500:]}") from None

        await cluster.delete_pod("cnf")
        await cluster.gone("cnf")

        async def released() -> bool:
            return _memif_info(work / "memif") is None and not list((work / "memif").glob("*"))

        await eventually(released, "the grant released with the pod", 60)
    finally:
        assert await cluster.retire(node) == 0
        for pod in ("cnf", "cnf-client"):
            await cluster.delete_pod(pod, "--grace-period=0", "--force", "--ignore-not-found")
        _kill_masters(cluster.work)
