"""Thirty pods made through the API at once on the two kubelets: each Running with its own
Neutron port's address, and all of them gone, ports and veths, once deleted."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.kube.conftest import Cluster
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns, pytest.mark.slow]

BURST = 30


async def test_thirty_pods_at_once_get_distinct_ports_and_leave_nothing(cluster: Cluster) -> None:
    hosts = cluster.hosts
    before = {host: cluster.pod_veths(host) for host in hosts}
    names = [f"burst-{i}" for i in range(BURST)]
    started = time.monotonic()
    await asyncio.gather(*(cluster.create_pod(name, hosts[i % 2]) for i, name in enumerate(names)))
    pods = await cluster.all_running(names, timeout=180)
    print(f"{BURST} pods Running {time.monotonic() - started:.1f} s after kubectl apply")
    ports = {p.device_id: p for p in await asyncio.to_thread(cluster.ports)}
    ips = [pod["status"]["podIPs"][0]["ip"] for pod in pods]
    assert len(set(ips)) == BURST
    for pod, ip in zip(pods, ips, strict=True):
        assert ports[pod["metadata"]["uid"]].fixed_ips[0]["ip_address"] == ip
    for host in hosts:
        assert len(cluster.pod_veths(host) - before[host]) == BURST // 2

    await cluster.kubectl.run("delete", "pod", "-n", cluster.namespace, *names, "--wait=false")
    uids = {pod["metadata"]["uid"] for pod in pods}

    async def released() -> bool:
        left = {p.device_id for p in await asyncio.to_thread(cluster.ports)} & uids
        return not left and all(cluster.pod_veths(h) == before[h] for h in hosts)

    await eventually(released, "the burst's ports and veths gone", 120)
