"""What podwire put on a node and someone took away is put back (#39 drift), against two real
agents on two simulated hosts: a pod's veth deleted or taken off its bridge is plugged again
with the same MAC and address, its traffic comes back, and the repair is counted."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire.agent import naming
from podwire.schema.fields import attachment_id
from tests.agent.harness import HostAgent, acni, plugin_binary
from tests.agent.netenv import NetEnv, in_ns, links_in, ping_settles
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack


async def test_a_pods_deleted_or_detached_veth_is_plugged_again(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, tmp_path: Path
) -> None:
    plugin = plugin_binary("c", tmp_path)
    pods = []
    for agent in agents:
        ns, cid = netenv.namespace(f"d{uuid.uuid4().hex[:4]}"), uuid.uuid4().hex
        call = await acni(plugin, "ADD", agent.conf(vxnet.id), container_id=cid,
                          netns=f"/run/netns/{ns}")  # fmt: skip
        assert call.code == 0, call.stdout
        pods.append((agent, ns, cid, call.json["ips"][0]["address"].split("/")[0]))
    (h1, ns1, cid1, ip1), (_, ns2, _, ip2) = pods
    assert await ping_settles(ns2, ip1)
    veth = naming.host_veth(attachment_id(cid1, "eth0"))
    mac = in_ns(ns1, "cat", "/sys/class/net/eth0/address").stdout.strip()
    assert h1.agent is not None
    count = h1.agent.metrics.registry.get_sample_value

    for tamper in (("link", "del", veth), ("link", "set", veth, "nomaster")):
        before = count("podwire_agent_attachment_repairs_total") or 0
        in_ns(h1.netns, "ip", *tamper)

        async def repaired(before: float = before) -> bool:
            return (count("podwire_agent_attachment_repairs_total") or 0) > before

        await eventually(repaired, f"the pod's veth repaired after ip {' '.join(tamper)}")
        assert await ping_settles(ns2, ip1) and await ping_settles(ns1, ip2)
        assert in_ns(ns1, "cat", "/sys/class/net/eth0/address").stdout.strip() == mac
        master = in_ns(h1.netns, "ip", "-o", "link", "show", veth).stdout
        assert f"master {naming.bridge(vxnet.id)}" in master

    for agent, ns, cid, _ in pods:
        gone = await acni(plugin, "DEL", agent.conf(vxnet.id), container_id=cid,
                          netns=f"/run/netns/{ns}")  # fmt: skip
        assert gone.code == 0, gone.stdout
        assert links_in(ns) == ["lo"]
