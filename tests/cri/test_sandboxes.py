"""Pod sandboxes through containerd's CRI, as kubelet drives them, wired by podwire."""

from __future__ import annotations

import asyncio

import pytest

from tests.agent.netenv import pings
from tests.cri.conftest import Node
from tests.cri.cri import Pod

pytestmark = pytest.mark.stack


async def test_one_sandbox_run_status_stop_twice_remove(node: Node) -> None:
    sandbox = await node.cri.run(Pod.new("one"))
    assert await node.cri.ready(sandbox)
    ip = await node.cri.ip(sandbox)
    ports = await node.port_ips()
    assert list(ports.values()) == [ip]  # the sandbox has its Neutron port's address
    assert len(node.pod_veths()) == 1

    await node.cri.stop(sandbox)
    await node.cri.stop(sandbox)  # kubelet stops again; the second DEL finds nothing to do
    assert node.pod_veths() == []
    assert await node.port_ips() == {}  # the port went with the pod
    await node.cri.remove(sandbox)
    assert await node.cri.sandboxes() == []


async def test_thirty_at_once_get_their_ports_and_ping_each_other(node: Node) -> None:
    pods = [Pod.new(f"burst-{i}") for i in range(30)]
    sandboxes = await asyncio.gather(*(node.cri.run(pod) for pod in pods))
    ips = await asyncio.gather(*(node.cri.ip(s) for s in sandboxes))
    assert sorted(ips) == sorted((await node.port_ips()).values())
    assert len(set(ips)) == 30
    namespaces = await asyncio.gather(*(node.cri.netns(s) for s in sandboxes[:3]))
    for source, target in ((0, 1), (1, 2), (2, 0)):
        ns = namespaces[source].rpartition("/")[2]
        assert await asyncio.to_thread(pings, ns, ips[target]), (source, target)

    await asyncio.gather(*(node.cri.stop(s) for s in sandboxes))
    await asyncio.gather(*(node.cri.remove(s) for s in sandboxes))
    assert node.pod_veths() == []
    assert await node.port_ips() == {}
    assert await node.cri.sandboxes() == []
