"""Pods made through the Kubernetes API on two real kubelets get podwire's ports: Running with
their Neutron port's addresses, pinging across the two hosts, and their ports gone with them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.kube.conftest import Cluster
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns]


def pod_ips(pod: dict[str, Any]) -> list[str]:
    return [entry["ip"] for entry in pod["status"].get("podIPs") or []]


async def _pings(cluster: Cluster, source: str, address: str) -> None:
    """An answer within a few tries: the other host learns a new pod's MAC through etcd."""

    async def answered() -> bool:
        out = await cluster.exec(source, "ping", "-c", "1", "-W", "1", address, check=False)
        return " 0% packet loss" in out

    await eventually(answered, f"{source} pings {address}", 20)


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

    async def released() -> bool:
        return await cluster.port_of(uid) is None and cluster.pod_veths(host) == before

    await eventually(released, "the deleted pod's port and veth gone", 30)
