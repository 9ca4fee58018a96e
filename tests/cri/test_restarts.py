"""Restarts and outages under running pods: containerd, the agent, and the agent being down
while kubelet starts or stops a sandbox (an error kubelet retries, then a clean finish)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tests.agent.netenv import pings
from tests.cri.conftest import Node
from tests.cri.cri import Pod, restart

pytestmark = pytest.mark.stack


async def _two_pods(node: Node) -> tuple[list[str], list[str], list[str]]:
    sandboxes = list(await asyncio.gather(*(node.cri.run(Pod.new(f"r{i}")) for i in range(2))))
    ips = list(await asyncio.gather(*(node.cri.ip(s) for s in sandboxes)))
    nss = [(await node.cri.netns(s)).rpartition("/")[2] for s in sandboxes]
    assert await asyncio.to_thread(pings, nss[0], ips[1])
    await node.ports_active(ips)
    return sandboxes, ips, nss


async def _stop_and_remove(node: Node, sandboxes: list[str]) -> None:
    for sandbox in sandboxes:
        await node.cri.stop(sandbox)
        await node.cri.remove(sandbox)
    assert node.pod_veths() == []
    assert await node.port_ips() == {}


async def test_containerd_restart_keeps_running_pods(node: Node) -> None:
    sandboxes, ips, nss = await _two_pods(node)
    await asyncio.to_thread(restart, node.containerd)
    for sandbox, ip in zip(sandboxes, ips, strict=True):
        assert await node.cri.ready(sandbox)
        assert await node.cri.ip(sandbox) == ip
    assert await asyncio.to_thread(pings, nss[1], ips[0])
    await node.ports_active(ips)
    await _two_pods_after(node)
    await _stop_and_remove(node, sandboxes)


async def _two_pods_after(node: Node) -> None:
    """Pods started after a restart get their ports ACTIVE too (they once stayed DOWN)."""
    sandboxes, _, _ = await _two_pods(node)
    for sandbox in sandboxes:
        await node.cri.stop(sandbox)
        await node.cri.remove(sandbox)


async def test_agent_restart_keeps_running_pods(node: Node) -> None:
    sandboxes, ips, nss = await _two_pods(node)
    await node.agent.stop()
    assert await asyncio.to_thread(pings, nss[1], ips[0])  # the dataplane does not need it
    await node.agent.start()
    assert await asyncio.to_thread(pings, nss[0], ips[1])
    await node.ports_active(ips)
    await _two_pods_after(node)
    await _stop_and_remove(node, sandboxes)  # DEL finds the attachments in the checkpoint


async def test_agent_down_during_run_then_kubelets_retry_succeeds(node: Node) -> None:
    await node.agent.stop()
    pod = Pod.new("retried")
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await node.cri.run(pod)
    assert "podwire agent not reachable" in str(failed.value.details())
    # Its DEL failed too, so containerd keeps the sandbox NOTREADY for kubelet to stop later.
    (left,) = await node.cri.sandboxes()
    assert not await node.cri.ready(left)
    assert node.pod_veths() == []
    assert await node.port_ips() == {}

    await node.agent.start()
    # kubelet's next sync: stop and remove the failed sandbox, run the pod's next attempt.
    await node.cri.stop(left)
    await node.cri.remove(left)
    sandbox = await node.cri.run(pod, attempt=1)
    ip = await node.cri.ip(sandbox)
    assert ip in (await node.port_ips()).values()
    await node.ports_active([ip])
    await _stop_and_remove(node, [sandbox])


async def test_agent_down_during_stop_then_kubelets_retry_cleans_up(node: Node) -> None:
    sandbox = await node.cri.run(Pod.new("stopped"))
    await node.agent.stop()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await node.cri.stop(sandbox)
    assert "podwire agent not reachable" in str(failed.value.details())
    assert len(node.pod_veths()) == 1  # nothing was half-removed
    await node.agent.start()
    await _two_pods_after(node)
    await _stop_and_remove(node, [sandbox])
