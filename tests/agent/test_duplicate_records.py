"""A port two in-use records hold (a restored etcd): the node's agent settles it, the
attachment its checkpoint names keeps the port, the other is released (real controller,
agent, plugin, Neutron)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.controller.app import Controller
from podwire.controller.recycler import recycle_once
from podwire.etcd.client import EtcdClient
from tests.agent.harness import HostAgent, acni
from tests.agent.netenv import NetEnv
from tests.agent.test_with_controller import pooled  # noqa: F401  (the fixture)
from tests.controller.conftest import Node
from tests.controller.test_one_owner import new_term

pytestmark = pytest.mark.stack


class _Running:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.service = controller.service


async def test_the_checkpointed_attachment_keeps_a_disputed_port(
    pooled: tuple[Controller, HostAgent, Node],  # noqa: F811
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    etcd: EtcdClient,
) -> None:
    controller, agent, node = pooled
    ns, cid = netenv.namespace("live"), uuid.uuid4().hex
    add = await acni(
        plugin, "ADD", agent.conf(vxnet.id), container_id=cid, netns=f"/run/netns/{ns}"
    )
    assert add.code == 0, add.stdout
    live = f"{cid}:eth0"
    record = await etcd.get(keys.vif(node.name, live))
    assert record is not None
    port = controller.service.term.attachments.vifs_of_node(node.name)[live].port_id
    await etcd.put(keys.vif(node.name, "restored:eth0"), record.value)
    await new_term(_Running(controller))
    assert set(controller.service.term.attachments.vifs_of_node(node.name)) == {
        live,
        "restored:eth0",
    }

    status = await acni(plugin, "STATUS", agent.conf(vxnet.id))  # the agent lists its VIFs
    assert status.code == 0, status.stdout
    assert set(controller.service.term.attachments.vifs_of_node(node.name)) == {live}
    await recycle_once(controller.service, controller.neutron, controller.settings.pool)
    assert controller.service.pools.pool_of(port) is None
    assert port not in controller.service.pools.recyclable()
    assert controller.service.term.attachments.vifs_of_node(node.name)[live].port_id == port
    delete = await acni(plugin, "DEL", agent.conf(vxnet.id), container_id=cid)
    assert delete.code == 0, delete.stdout
