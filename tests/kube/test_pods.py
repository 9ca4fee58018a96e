"""Pods made through the Kubernetes API on two real kubelets get podwire's ports: Running with
their Neutron port's addresses, pinging across the two hosts, and their ports gone with them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from podwire.kube.node import node_dir
from podwire.kube.sandboxes import Runtime
from podwire.stack import procs
from tests.kube.conftest import Cluster
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns]


def pod_ips(pod: dict[str, Any]) -> list[str]:
    return [entry["ip"] for entry in pod["status"].get("podIPs") or []]


async def _pings(cluster: Cluster, source: str, address: str) -> None:
    """An answer within a few tries: the other host learns a new pod's MAC through etcd."""

    last = [""]

    async def answered() -> bool:
        last[0] = await cluster.exec(source, "ping", "-c", "1", "-W", "1", address, check=False)
        return " 0% packet loss" in last[0]

    try:
        await eventually(answered, f"{source} pings {address}", 20)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last ping: {last[0]!r}") from None


async def _released(cluster: Cluster, uid: str, host: str, veths: set[str]) -> None:
    """The pod's port is gone from Neutron and its host has the pod veths it had before."""

    async def released() -> bool:
        return await cluster.port_of(uid) is None and cluster.pod_veths(host) == veths

    await eventually(released, "the deleted pod's port and veth gone", 30)


async def test_pods_through_the_api_get_their_ports_and_ping_across_hosts(
    cluster: Cluster,
) -> None:
    h1, h2 = cluster.hosts
    wanted = {"pa": h1, "pb": h2, "pc": ""}  # pc: wherever the scheduler puts it
    started = time.monotonic()
    await asyncio.gather(*(cluster.create_pod(name, node) for name, node in wanted.items()))
    pods = dict(zip(wanted, await asyncio.gather(*map(cluster.running, wanted)), strict=True))
    print(f"3 pods Running {time.monotonic() - started:.2f} s after kubectl apply")
    assert pods["pa"]["spec"]["nodeName"] == h1 and pods["pb"]["spec"]["nodeName"] == h2
    assert pods["pc"]["spec"]["nodeName"] in (h1, h2)
    for pod in pods.values():
        port = await cluster.port_of(pod["metadata"]["uid"])
        assert port is not None, pod["metadata"]["name"]
        assert pod_ips(pod) == [ip["ip_address"] for ip in port.fixed_ips]
        assert port.binding_host_id == pod["spec"]["nodeName"]
    for source, target in (("pa", "pb"), ("pb", "pa"), ("pc", "pa"), ("pc", "pb")):
        await _pings(cluster, source, pod_ips(pods[target])[0])
    await asyncio.gather(*(cluster.delete_pod(name) for name in wanted))
    await asyncio.gather(*map(cluster.gone, wanted))


@pytest.mark.parametrize("flags", [(), ("--grace-period=0", "--force")], ids=["graceful", "force"])
async def test_a_deleted_pod_takes_its_port_and_veth_with_it(
    cluster: Cluster, flags: tuple[str, ...]
) -> None:
    host = cluster.hosts[0]
    before = cluster.pod_veths(host)
    await cluster.create_pod("pdel", host)
    pod = await cluster.running("pdel")
    uid = pod["metadata"]["uid"]
    assert await cluster.port_of(uid) is not None
    assert len(cluster.pod_veths(host) - before) == 1

    await cluster.delete_pod("pdel", *flags)
    await cluster.gone("pdel")
    await _released(cluster, uid, host, before)


async def test_a_sandbox_killed_behind_kubelet_is_replaced_without_leaks(cluster: Cluster) -> None:
    host = cluster.hosts[0]
    node = next(node for node in cluster.nodes if node.host == host)
    before = cluster.pod_veths(host)
    await cluster.create_pod("ps", host)
    uid = (await cluster.running("ps"))["metadata"]["uid"]
    first = await cluster.port_of(uid)
    assert first is not None
    runtime = Runtime(node.announced["containerd_socket"])
    try:
        (sandbox,) = [s for s in runtime.sandboxes() if s.name == "ps"]
    finally:
        runtime.close()
    ctr = ["ctr", "--address", node.announced["containerd_socket"], "-n", "k8s.io"]
    kill = [*ctr, "task", "kill", "-s", "SIGKILL", sandbox.id]
    await asyncio.to_thread(subprocess.run, kill, check=True)

    async def replaced() -> bool:
        ports = [p for p in await asyncio.to_thread(cluster.ports) if p.device_id == uid]
        renewed = len(ports) == 1 and ports[0].id != first.id
        return renewed and len(cluster.pod_veths(host) - before) == 1

    await eventually(replaced, "the old sandbox's port released and a new one wired", 60)
    port = await cluster.port_of(uid)
    assert port is not None
    addresses = [ip["ip_address"] for ip in port.fixed_ips]

    async def reported() -> bool:
        return pod_ips(await cluster.running("ps")) == addresses

    await eventually(reported, "the pod's status showing its new port's address", 30)
    await cluster.delete_pod("ps")
    await cluster.gone("ps")
    await _released(cluster, uid, host, before)


async def test_a_killed_kubelet_is_restarted_and_its_pods_keep_their_ports(
    cluster: Cluster,
) -> None:
    host = cluster.hosts[0]
    before = cluster.pod_veths(host)
    await cluster.create_pod("pk1", host)
    pod = await cluster.running("pk1")
    uid, first = pod["metadata"]["uid"], await cluster.port_of(pod["metadata"]["uid"])
    marker = str(node_dir(Path(cluster.info["data_dir"]), host) / "kubelet-config.json")
    (old,) = procs.pids_marked(marker)
    os.kill(old, signal.SIGKILL)

    async def restarted() -> bool:
        return [pid for pid in procs.pids_marked(marker) if pid != old] != []

    await eventually(restarted, "kube-node starting kubelet again", 30)
    await cluster.create_pod("pk2", host)  # the new kubelet serves
    second = await cluster.running("pk2")
    assert "pk1" in await cluster.exec("pk1", "hostname")
    port = await cluster.port_of(uid)
    assert first is not None and port is not None and port.id == first.id
    pod = await cluster.running("pk1")
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert len(cluster.pod_veths(host) - before) == 2
    await asyncio.gather(*(cluster.delete_pod(name) for name in ("pk1", "pk2")))
    await asyncio.gather(*(cluster.gone(name) for name in ("pk1", "pk2")))
    await _released(cluster, second["metadata"]["uid"], host, before)
    assert await cluster.port_of(uid) is None


async def test_an_agent_restart_under_running_pods_keeps_them_pinging(cluster: Cluster) -> None:
    h1, h2 = cluster.hosts
    before = {host: cluster.pod_veths(host) for host in (h1, h2)}
    await asyncio.gather(cluster.create_pod("pa1", h1), cluster.create_pod("pa2", h2))
    pods = await asyncio.gather(cluster.running("pa1"), cluster.running("pa2"))
    agent = cluster.agent(h2)
    await agent.stop()
    await agent.start()  # takes its pods back from its checkpoint
    await _pings(cluster, "pa1", pod_ips(pods[1])[0])
    await _pings(cluster, "pa2", pod_ips(pods[0])[0])
    await asyncio.gather(*(cluster.delete_pod(name) for name in ("pa1", "pa2")))
    await asyncio.gather(*(cluster.gone(name) for name in ("pa1", "pa2")))
    for pod, host in zip(pods, (h1, h2), strict=True):
        await _released(cluster, pod["metadata"]["uid"], host, before[host])
