"""Two pods whose (container id, ifname) a '.'-join confused each get their own port.

Before, ``a.b`` + ``c`` and ``a`` + ``b.c`` were one attachment: the second pod was handed the
first one's port and CHECK still said OK. Through the real plugin, agent and Neutron.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.agent.harness import HostAgent, acni
from tests.agent.netenv import NetEnv

pytestmark = pytest.mark.stack


async def test_attachments_a_dot_join_confused_stay_apart(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, plugin: Path, neutron: Any, project_id: str
) -> None:
    agent = agents[0]
    base = uuid.uuid4().hex[:12]
    pods = [
        (netenv.namespace("pa"), f"{base}.b", "c"),
        (netenv.namespace("pb"), base, "b.c"),
    ]
    conf = agent.conf(vxnet.id)
    results = []
    for ns, cid, ifname in pods:
        call = await acni(
            plugin, "ADD", conf, container_id=cid, netns=f"/run/netns/{ns}", ifname=ifname
        )
        assert call.code == 0, call.stdout
        results.append(call.json)
    ips = [result["ips"][0]["address"] for result in results]
    macs = [result["interfaces"][-1]["mac"] for result in results]
    assert ips[0] != ips[1] and macs[0] != macs[1]
    ours = [
        p
        for p in neutron.network.ports(project_id=project_id)
        if p.device_owner == "compute:podwire"
    ]
    assert len(ours) == 2

    # Deleting one leaves the other as ADD made it.
    ns, cid, ifname = pods[0]
    gone = await acni(
        plugin, "DEL", conf, container_id=cid, netns=f"/run/netns/{ns}", ifname=ifname
    )
    assert gone.code == 0, gone.stdout
    ns, cid, ifname = pods[1]
    check = await acni(
        plugin,
        "CHECK",
        {**conf, "prevResult": results[1]},
        container_id=cid,
        netns=f"/run/netns/{ns}",
        ifname=ifname,
    )
    assert check.code == 0, check.stdout
    left = [
        p
        for p in neutron.network.ports(project_id=project_id)
        if p.device_owner == "compute:podwire"
    ]
    assert [p.mac_address for p in left] == [macs[1]]
    await acni(plugin, "DEL", conf, container_id=cid, netns=f"/run/netns/{ns}", ifname=ifname)
