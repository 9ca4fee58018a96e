"""A failed ADD leaves nothing: the checkpoint entry written while the pod was plugged goes
with the veth and the port. Through the real plugin, agent, kernel and Neutron."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire.agent.ports.checkpoint import ATTACHMENTS_FILE
from tests.agent.harness import HostAgent, acni
from tests.agent.netenv import NetEnv, in_ns, links_in

pytestmark = pytest.mark.stack


def _recorded(agent: HostAgent) -> dict[str, Any]:
    path = agent.work / f"{agent.host}-state" / ATTACHMENTS_FILE
    return json.loads(path.read_text()).get("attachments", {}) if path.exists() else {}


async def test_a_plug_that_fails_leaves_no_record_veth_or_port(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, plugin: Path, neutron: Any, project_id: str
) -> None:
    agent = agents[0]
    conf = agent.conf(vxnet.id)
    ns = netenv.namespace("rb")
    in_ns(ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "x0")  # name taken
    cid = uuid.uuid4().hex
    call = await acni(plugin, "ADD", conf, container_id=cid, netns=f"/run/netns/{ns}")
    assert call.code != 0 and "exists" in call.stdout.lower(), call.stdout
    assert not [key for key in _recorded(agent) if key.startswith(cid)]
    assert not [link for link in links_in(agent.netns) if link.startswith("pwp")]
    ours = [p for p in neutron.network.ports(project_id=project_id) if p.device_owner]
    assert not [p for p in ours if p.binding_host_id == agent.host]

    # The same pod, once its name is free, is plugged and recorded.
    in_ns(ns, "ip", "link", "del", "eth0")
    again = await acni(plugin, "ADD", conf, container_id=cid, netns=f"/run/netns/{ns}")
    assert again.code == 0, again.stdout
    assert [key for key in _recorded(agent) if key.startswith(cid)]
    assert "eth0" in links_in(ns)
    gone = await acni(plugin, "DEL", conf, container_id=cid, netns=f"/run/netns/{ns}")
    assert gone.code == 0, gone.stdout
