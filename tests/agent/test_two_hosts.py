"""End to end: two simulated hosts, real agents, real Neutron and etcd, pods that ping."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.etcd import EtcdClient
from tests.agent.harness import HostAgent, acni
from tests.agent.netenv import NetEnv, links_in, pings

pytestmark = pytest.mark.stack


def _cid() -> str:
    return uuid.uuid4().hex


@pytest.mark.smoke  # CI's end-to-end check on every supported Python (.ci/run)
async def test_pods_on_two_hosts_ping_and_del_leaves_nothing(
    agents: list[HostAgent],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
    etcd: EtcdClient,
) -> None:
    pods = []
    for index, agent in enumerate(agents):
        ns = netenv.namespace(f"pod{index}")
        cid = _cid()
        args = f"K8S_POD_NAMESPACE=default;K8S_POD_NAME=p{index};K8S_POD_UID={uuid.uuid4()}"
        call = await acni(
            plugin,
            "ADD",
            agent.conf(vxnet.id),
            container_id=cid,
            netns=f"/run/netns/{ns}",
            args=args,
        )
        assert call.code == 0, call.stdout
        result = call.json
        assert result["cniVersion"] == "1.1.0"
        assert [i.get("sandbox") for i in result["interfaces"]] == [None, f"/run/netns/{ns}"]
        assert result["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.77.0.1"}]
        pods.append((agent, ns, cid, result))

    ip1 = pods[1][3]["ips"][0]["address"].split("/")[0]
    assert pings(pods[0][1], ip1)

    agent, ns, cid, result = pods[0]
    again = await acni(
        plugin, "ADD", agent.conf(vxnet.id), container_id=cid, netns=f"/run/netns/{ns}"
    )
    assert again.code == 0 and again.json == result
    check = await acni(
        plugin,
        "CHECK",
        agent.conf(vxnet.id, prevResult=result),
        container_id=cid,
        netns=f"/run/netns/{ns}",
    )
    assert check.code == 0, check.stdout

    for agent, ns, cid, _ in pods:
        for _ in range(2):  # DEL is idempotent
            gone = await acni(
                plugin, "DEL", agent.conf(vxnet.id), container_id=cid, netns=f"/run/netns/{ns}"
            )
            assert gone.code == 0, gone.stdout
        assert links_in(ns) == ["lo"]
    assert list(neutron.network.ports(project_id=project_id, device_owner="compute:podwire")) == []
    for agent in agents:
        items, _ = await etcd.get_prefix(keys.state_node_prefix(agent.host) + "ports/")
        assert items == []
