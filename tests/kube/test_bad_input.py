"""Bad input met through the real kubelet: a node whose CNI config names a Neutron network
without a subnet, and a node whose podwire agent is down. kubelet reports podwire's CNI error in
its ``FailedCreatePodSandBox`` events, names the cause, retries by itself, and nothing is left
behind (no Neutron port, no veth, no etcd key of the host's ports) while it fails; once the cause
is gone its own retry makes the pod Running with its port's address."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from podwire.kube.node import node_dir
from tests.kube.conftest import Cluster
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns]

BARE_SUBNET = "10.79.1.0/24"


def pod_ips(pod: dict[str, Any]) -> list[str]:
    return [entry["ip"] for entry in pod["status"].get("podIPs") or []]


async def pod_events(cluster: Cluster, pod: str) -> list[tuple[str, str, int]]:
    """kubelet's events of a pod: (reason, message, count) each."""
    selector = f"involvedObject.name={pod}"
    listed = json.loads(
        await cluster.kubectl.run(
            "get", "events", "-n", cluster.namespace, "--field-selector", selector, "-o", "json"
        )
    )
    return [(e["reason"], e["message"], int(e.get("count") or 1)) for e in listed["items"]]


async def failed_attempts(
    cluster: Cluster, pod: str, cause: str, attempts: int
) -> dict[str, list[str]]:
    """Waits until kubelet's events of the pod name ``cause`` ``attempts`` times (each event's
    count included); returns those messages by reason."""
    seen: dict[str, list[str]] = {}

    async def failed() -> bool:
        found = [event for event in await pod_events(cluster, pod) if cause in event[1]]
        seen.clear()
        for reason, message, _ in found:
            seen.setdefault(reason, []).append(message)
        return sum(count for _, _, count in found) >= attempts

    try:
        await eventually(failed, f"{attempts} events naming {cause!r}", 120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; events: {await pod_events(cluster, pod)}") from None
    return seen


async def sandbox_changes(cluster: Cluster, pod: str, count: int) -> None:
    async def changed() -> bool:
        events = await pod_events(cluster, pod)
        return sum(n for reason, _, n in events if reason == "SandboxChanged") >= count

    await eventually(changed, f"kubelet re-creating {pod}'s sandbox {count} times", 120)


async def nothing_of(
    cluster: Cluster, uid: str, host: str, veths: set[str], keys: set[str]
) -> None:
    """No port for the pod in Neutron; the host's pod veths and port keys as they were."""
    assert await cluster.port_of(uid) is None
    assert cluster.pod_veths(host) == veths
    assert set(await cluster.port_keys(host)) == keys


async def released(cluster: Cluster, uid: str, host: str, veths: set[str], keys: set[str]) -> None:
    async def clean() -> bool:
        return (
            await cluster.port_of(uid) is None
            and cluster.pod_veths(host) == veths
            and set(await cluster.port_keys(host)) == keys
        )

    await eventually(clean, "the deleted pod's port, veth and etcd keys gone", 30)


async def test_a_network_without_subnet_is_named_in_kubelets_events_and_nothing_leaks(
    cluster: Cluster,
) -> None:
    neutron, project = cluster.neutron, cluster.network.project_id
    bare = await asyncio.to_thread(
        neutron.network.create_network, name="pw-kube-bare", project_id=project
    )
    agent = await cluster.add_agent(5)
    host = agent.host
    node = await cluster.start_node(agent, bare)  # its conflist names the bare network
    try:
        veths, keys = cluster.pod_veths(host), set(await cluster.port_keys(host))
        await cluster.create_pod("pns", host)
        pod = await cluster.kubectl.get("pod", "-n", cluster.namespace, "pns")
        assert pod is not None
        uid = pod["metadata"]["uid"]
        cause = f"network {bare.id!r} has no subnet, so a pod would get no address"
        failed = await failed_attempts(cluster, "pns", cause, 2)  # kubelet retries
        print(f"kubelet's events: {failed}")
        assert 'plugin type="podwire" failed (add)' in failed["FailedCreatePodSandBox"][-1]
        await nothing_of(cluster, uid, host, veths, keys)
        ports = await asyncio.to_thread(lambda: list(neutron.network.ports(network_id=bare.id)))
        assert ports == []
        pod = await cluster.kubectl.get("pod", "-n", cluster.namespace, "pns")
        assert pod is not None and pod["status"]["phase"] == "Pending"

        # The cause fixed in Neutron: kubelet's own retry makes the pod Running.
        await asyncio.to_thread(
            neutron.network.create_subnet, network_id=bare.id, cidr=BARE_SUBNET, ip_version=4,
            project_id=project, gateway_ip="10.79.1.1",
        )  # fmt: skip
        pod = await cluster.running("pns", timeout=120)
        port = await cluster.port_of(uid)
        assert port is not None and port.network_id == bare.id
        assert pod_ips(pod) == [ip["ip_address"] for ip in port.fixed_ips]
        await cluster.delete_pod("pns")
        await cluster.gone("pns")
        await released(cluster, uid, host, veths, keys)
    finally:
        assert await cluster.retire(node) == 0
        await cluster.delete_pod("pns", "--grace-period=0", "--force", "--ignore-not-found")


async def test_a_pod_whose_agent_is_down_names_its_socket_and_runs_once_it_is_back(
    cluster: Cluster,
) -> None:
    host = cluster.hosts[1]
    agent = cluster.agent(host)
    veths, keys = cluster.pod_veths(host), set(await cluster.port_keys(host))
    await agent.stop()
    try:
        await cluster.create_pod("pr", host)
        pod = await cluster.kubectl.get("pod", "-n", cluster.namespace, "pr")
        assert pod is not None
        uid = pod["metadata"]["uid"]
        cause = f"podwire agent not reachable at {agent.socket}: "
        failed = await failed_attempts(cluster, "pr", cause, 1)
        print(f"kubelet's events: {failed}")
        assert 'plugin type="podwire" failed (add)' in failed["FailedCreatePodSandBox"][0]
        # containerd keeps the sandbox whose DEL failed too; kubelet kills it to make a new
        # one, again and again (SandboxChanged), and each kill's DEL names the cause in its log
        await sandbox_changes(cluster, "pr", 2)
        log = node_dir(Path(cluster.info["data_dir"]), host) / "logs" / "kubelet.log"
        stops = [
            line for line in log.read_text().splitlines()
            if "failed to destroy network for sandbox" in line and cause in line
        ]  # fmt: skip
        assert stops, f"no failed DEL naming the cause in {log}"
        print(f"kubelet's log: {stops[-1]}")
        assert await cluster.port_of(uid) is None
        assert cluster.pod_veths(host) == veths
    finally:
        await agent.start()
    assert set(await cluster.port_keys(host)) == keys
    pod = await cluster.running("pr", timeout=120)  # kubelet's own back-off decides when
    ports = [p for p in await asyncio.to_thread(cluster.ports) if p.device_id == uid]
    assert len(ports) == 1 and [ip["ip_address"] for ip in ports[0].fixed_ips] == pod_ips(pod)
    assert ports[0].binding_host_id == host
    await cluster.delete_pod("pr")
    await cluster.gone("pr")
    await released(cluster, uid, host, veths, keys)
