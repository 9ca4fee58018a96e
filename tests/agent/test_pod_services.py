"""The agent's Services follower (agent/services/pods.py) on the real etcd and real pod
namespaces: what it writes into each pod's table is read back from the kernel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from podwire import keys
from podwire.agent.services.pods import PodServices
from podwire.etcd import EtcdClient
from podwire.schema.checkpoints import Attached, Attachment
from podwire.schema.services import Backend, ServiceEntry, ServicePort
from podwire.schema.vif import Vif
from tests.agent.netenv import in_ns, sh
from tests.scripted_agent import eventually

pytestmark = [
    pytest.mark.stack,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces"),
]

NET = "7c1f0c2a-0000-4000-8000-0000000000aa"
OTHER = "7c1f0c2a-0000-4000-8000-0000000000bb"


def _pod(netns: str, network: str) -> Attachment:
    vif = Vif(f"port-{netns}", network, "project", "02:00:00:00:00:01", 1450, [])
    attached = Attached("h", "02:00:00:00:00:02", "eth0", "02:00:00:00:00:01", 1450, "", ())
    return Attachment(
        f"{netns}:eth0", netns, "eth0", "podwire", f"/run/netns/{netns}", None, vif, attached
    )


@pytest.fixture
def pods() -> Iterator[dict[str, Attachment]]:
    tag = uuid.uuid4().hex[:6]
    made = {f"pwps-{tag}-{i}": network for i, network in enumerate((NET, NET, OTHER))}
    for name in made:
        sh("ip", "netns", "add", name)
    try:
        yield {f"{name}:eth0": _pod(name, network) for name, network in made.items()}
    finally:
        for name in made:
            sh("ip", "netns", "del", name, check=False)


@pytest.fixture
async def follower(
    etcd: EtcdClient, prefix: str, pods: dict[str, Attachment]
) -> AsyncIterator[tuple[EtcdClient, PodServices]]:
    view = etcd.within(prefix.rstrip("/"))
    services = PodServices(view, lambda: pods)
    task = asyncio.create_task(services.run())
    try:
        yield view, services
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        services.close()


def _entry(backends: list[tuple[str, str]], name: str = "web") -> ServiceEntry:
    port = ServicePort("tcp", 80, tuple(Backend(addr, 8080, net) for addr, net in backends))
    return ServiceEntry(f"shop/{name}", ("10.96.5.5",), False, (port,))


def _listed(pod: Attachment) -> str:
    netns = pod.netns.rsplit("/", 1)[1]
    found = in_ns(netns, "nft", "list", "table", "ip", "podwire_services", check=False)
    return found.stdout


async def _until_listed(pods: list[Attachment], present: list[str], absent: list[str]) -> None:
    async def shown() -> bool:
        for pod in pods:
            listed = _listed(pod)
            if any(p not in listed for p in present) or any(a in listed for a in absent):
                return False
        return True

    await eventually(shown, f"{present} and not {absent} in the pods' tables", 10)


async def test_each_pod_gets_its_own_network_s_backends_and_follows_changes(
    follower: tuple[EtcdClient, PodServices], pods: dict[str, Attachment]
) -> None:
    etcd, _ = follower
    same, _, other = pods.values()
    key = keys.service("shop", "web")
    await etcd.put(key, _entry([("10.0.0.5", NET), ("10.0.0.6", OTHER)]).encode())
    await _until_listed([same], ["10.0.0.5 . 8080"], ["10.0.0.6"])
    await _until_listed([other], ["10.0.0.6 . 8080"], ["10.0.0.5"])

    await etcd.put(key, _entry([("10.0.0.7", NET), ("10.0.0.6", OTHER)]).encode())
    await _until_listed([same], ["10.0.0.7 . 8080"], ["10.0.0.5"])

    # 20 backends need a picking chain no table has yet: the table is written whole.
    wide = [(f"10.0.1.{i}", NET) for i in range(1, 21)]
    await etcd.put(key, _entry(wide).encode())
    await _until_listed([same], ["pick_20", "10.0.1.20 . 8080"], ["10.0.0.7"])

    await etcd.delete(key)
    await _until_listed([same], [], ["10.96.5.5"])


async def test_a_bad_value_is_skipped_and_the_others_still_served(
    follower: tuple[EtcdClient, PodServices], pods: dict[str, Attachment]
) -> None:
    etcd, services = follower
    same = next(iter(pods.values()))
    good = keys.service("shop", "good")
    await etcd.put(good, _entry([("10.0.0.5", NET)], "good").encode())
    await _until_listed([same], ["10.0.0.5 . 8080"], [])
    bad: Any = b'{"v": 1, "service": "shop/bad", "ips": ["10.96.5.6"], "ports": "x"}'
    await etcd.put(keys.service("shop", "bad"), bad)
    await etcd.put(good, _entry([("10.0.0.9", NET)], "good").encode())
    await _until_listed([same], ["10.0.0.9 . 8080"], ["10.96.5.6"])
    assert keys.service("shop", "bad") not in services.entries
