"""Chaining with the reference plugins, restart adoption, a burst of ADDs, GC, clean DEL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.etcd import EtcdClient
from podwire.schema import nodes
from tests.agent.harness import HostAgent, acni
from tests.agent.netenv import NetEnv, links_in, pings

pytestmark = pytest.mark.stack


def _reference(host_ns: str, plugin: str, conf: dict[str, Any], env: dict[str, str]) -> Any:
    """Run a Debian reference plugin inside the simulated host, as a runtime's chain would."""
    argv = ["ip", "netns", "exec", host_ns, f"/usr/lib/cni/{plugin}"]
    proc = subprocess.run(
        argv, input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, (plugin, proc.stdout, proc.stderr)
    return json.loads(proc.stdout) if proc.stdout.strip() else None


@pytest.mark.parametrize("version", ["1.0.0", "0.4.0"])
async def test_tuning_and_portmap_accept_our_result(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, version: str, plugin: Path
) -> None:
    agent = agents[0]
    pod = netenv.namespace("pod")
    cid = uuid.uuid4().hex
    binary = plugin
    ours = await acni(
        binary, "ADD", agent.conf(vxnet.id, version), container_id=cid, netns=f"/run/netns/{pod}"
    )
    assert ours.code == 0, ours.stdout
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": f"/run/netns/{pod}",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }
    base = {"cniVersion": version, "name": "podwire-test"}
    tuned = await asyncio.to_thread(
        _reference,
        agent.netns,
        "tuning",
        {
            **base,
            "type": "tuning",
            "sysctl": {"net.ipv4.conf.eth0.rp_filter": "0"},
            "prevResult": ours.json,
        },
        env,
    )
    assert tuned["ips"] == ours.json["ips"]
    mapped = await asyncio.to_thread(
        _reference,
        agent.netns,
        "portmap",
        {**base, "type": "portmap", "capabilities": {"portMappings": True}, "prevResult": tuned},
        env,
    )
    assert mapped["interfaces"] == ours.json["interfaces"]
    check = await acni(
        binary,
        "CHECK",
        agent.conf(vxnet.id, version, prevResult=mapped),
        container_id=cid,
        netns=f"/run/netns/{pod}",
    )
    assert check.code == 0, check.stdout
    gone = await acni(binary, "DEL", agent.conf(vxnet.id, version), container_id=cid)
    assert gone.code == 0


async def test_restart_keeps_pods_connected_and_state(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, plugin: Path
) -> None:
    binary = plugin
    pods = []
    for agent in agents:
        ns = netenv.namespace(f"pod-{agent.host[-2:]}")
        cid = uuid.uuid4().hex
        call = await acni(
            binary, "ADD", agent.conf(vxnet.id), container_id=cid, netns=f"/run/netns/{ns}"
        )
        assert call.code == 0, call.stdout
        pods.append((agent, ns, cid, call.json))
    target = pods[1][3]["ips"][0]["address"].split("/")[0]
    assert pings(pods[0][1], target)

    restarted = agents[0]
    await restarted.stop()
    await restarted.start()
    assert pings(pods[0][1], target, timeout=1.0)
    agent, ns, cid, result = pods[0]
    again = await acni(
        binary, "ADD", agent.conf(vxnet.id), container_id=cid, netns=f"/run/netns/{ns}"
    )
    assert again.json == result  # from the checkpoint, not a second port
    for agent, _ns, cid, _ in pods:
        assert (await acni(binary, "DEL", agent.conf(vxnet.id), container_id=cid)).code == 0


async def test_fifty_concurrent_adds_then_gc_and_del_leave_nothing(
    agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
    etcd: EtcdClient,
) -> None:
    binary = plugin
    agent = agents[0]
    pods = [(netenv.namespace(f"b{i}"), uuid.uuid4().hex) for i in range(50)]
    calls = await asyncio.gather(
        *(
            acni(binary, "ADD", agent.conf(vxnet.id), container_id=cid, netns=f"/run/netns/{ns}")
            for ns, cid in pods
        )
    )
    assert [c.code for c in calls] == [0] * 50, [c.stdout for c in calls if c.code]
    addresses = {c.json["ips"][0]["address"] for c in calls}
    assert len(addresses) == 50

    keep = [{"containerID": cid, "ifname": "eth0"} for _, cid in pods[:25]]
    gc = await acni(binary, "GC", agent.conf(vxnet.id, **{"cni.dev/valid-attachments": keep}))
    assert gc.code == 0, gc.stdout
    assert all(links_in(ns) == ["lo"] for ns, _ in pods[25:])
    assert all("eth0" in links_in(ns) for ns, _ in pods[:25])

    dels = await asyncio.gather(
        *(acni(binary, "DEL", agent.conf(vxnet.id), container_id=cid) for _, cid in pods)
    )
    assert [c.code for c in dels] == [0] * 50
    assert not [n for n in links_in(agent.netns) if n.startswith("pwp")]
    assert [
        p.id for p in neutron.network.ports(project_id=project_id, device_owner="compute:podwire")
    ] == []

    async def plumbing_gone() -> bool:
        items, _ = await etcd.get_prefix(keys.state_node_prefix(agent.host) + "ports/")
        return not items and not [n for n in links_in(agent.netns) if n.startswith("pw")]

    from tests.scripted_agent import eventually

    await eventually(plumbing_gone, "state keys and bridges gone")


async def test_stopping_agent_drops_wired_state_of_ports_it_no_longer_serves(
    agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    etcd: EtcdClient,
) -> None:
    """A port whose desired key went while the agent was stopping (its watch had ended) must
    not stay reported wired: the agent reads what is desired once more on its way out."""
    agent = agents[0]
    ns = netenv.namespace("sw")
    add = await acni(plugin, "ADD", agent.conf(vxnet.id), container_id=uuid.uuid4().hex,
                     netns=f"/run/netns/{ns}")  # fmt: skip
    assert add.code == 0, add.stdout
    served, _ = await etcd.get_prefix(keys.state_ports_prefix(agent.host))
    assert len(served) == 1
    unseen = keys.state_port(agent.host, str(uuid.uuid4()))  # its desired key went unseen
    await etcd.put(unseen, nodes.port_state_value(time.time()))
    await agent.stop()
    left, _ = await etcd.get_prefix(keys.state_ports_prefix(agent.host))
    assert [kv.key for kv in left] == [served[0].key]
