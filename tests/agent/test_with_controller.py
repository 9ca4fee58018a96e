"""CNI GC reconciles with the controller: a VIF handed out just before an agent crash (so the
checkpoint never recorded it) is released by the next GC, through the real plugin."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.agent import naming
from podwire.agent.vifs.controller_vifs import ControllerVifSource
from podwire.cni import spec
from podwire.config import EtcdSettings
from podwire.controller.app import Controller
from podwire.controller.leader import ELECTION
from podwire.controller.recycler import recycle_once
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect
from podwire.schema.inuse import PoolKey
from tests.agent.harness import HostAgent, acni
from tests.agent.netenv import NetEnv, in_ns, links_in
from tests.controller.conftest import Node, pooled_ports, request_vif, settings_for, vif_body
from tests.etcd_tools import delete_prefix
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack


@pytest.fixture
async def pooled(
    stack: dict[str, Any],
    etcd: EtcdClient,
    etcd_settings: EtcdSettings,
    netenv: NetEnv,
    hostnames: list[str],
    neutron_endpoint: str,
    tmp_path: Path,
) -> AsyncIterator[tuple[Controller, HostAgent, Node]]:
    """A controller in this loop and one agent that gets its VIFs from it."""
    args = (stack, etcd, etcd_settings, netenv, hostnames, neutron_endpoint, tmp_path)
    async with controller_and_agent(*args) as running:
        yield running


@contextlib.asynccontextmanager
async def controller_and_agent(
    stack: dict[str, Any],
    etcd: EtcdClient,
    etcd_settings: EtcdSettings,
    netenv: NetEnv,
    hostnames: list[str],
    neutron_endpoint: str,
    tmp_path: Path,
    security_groups: str = "off",
) -> AsyncIterator[tuple[Controller, HostAgent, Node]]:
    node = Node(hostnames[0], uuid.uuid4().hex)
    settings = settings_for(stack, [node], min=0)
    controller = Controller(settings, etcd, connect(settings.neutron))
    task = asyncio.create_task(controller.run())
    ns, vtep = netenv.host(1)
    agent = HostAgent(node.name, ns, vtep, tmp_path, etcd_settings, neutron_endpoint)
    agent.security_groups = security_groups
    try:
        await eventually(lambda: _serving(controller, task), "controller serving", timeout=60)
        agent.vifs = ControllerVifSource(
            f"http://127.0.0.1:{controller.port}", node.name, node.token
        )
        await agent.start()
        yield controller, agent, node
    finally:
        await agent.stop()
        if isinstance(agent.vifs, ControllerVifSource):
            await agent.vifs.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await etcd.delete(ELECTION)
        await delete_prefix(etcd, keys.vifs_prefix(node.name))


async def _serving(controller: Controller, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()
    return controller.service.serving


async def test_gc_releases_vifs_the_checkpoint_never_recorded(
    pooled: tuple[Controller, HostAgent, Node],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
) -> None:
    controller, agent, node = pooled
    kept_ns, kept_cid = netenv.namespace("kept"), uuid.uuid4().hex
    add = await acni(
        plugin, "ADD", agent.conf(vxnet.id), container_id=kept_cid, netns=f"/run/netns/{kept_ns}"
    )
    assert add.code == 0, add.stdout
    # The crash: the controller answered the agent's request, the checkpoint was never written.
    base = f"http://127.0.0.1:{controller.port}"
    async with aiohttp.ClientSession() as http:
        status, body = await request_vif(http, base, node, vif_body("crashed:eth0", vxnet))
    assert status == 200, body
    orphan = body["vif"]["port_id"]
    # ... and it may have got as far as the host veth (created and marked, never recorded).
    veth = naming.host_veth("crashed:eth0")
    in_ns(agent.netns, "ip", "link", "add", veth, "type", "veth", "peer", "name", "pwtc0")
    in_ns(agent.netns, "ip", "link", "set", veth, "alias", naming.MARK)
    assert set(controller.service.term.attachments.vifs_of_node(node.name)) == {
        f"{kept_cid}:eth0",
        "crashed:eth0",
    }

    keep = [{"containerID": kept_cid, "ifname": "eth0"}]
    gc = await acni(plugin, "GC", agent.conf(vxnet.id, **{"cni.dev/valid-attachments": keep}))
    assert gc.code == 0, gc.stdout
    assert set(controller.service.term.attachments.vifs_of_node(node.name)) == {f"{kept_cid}:eth0"}
    assert "eth0" in links_in(kept_ns)  # the valid attachment is untouched
    assert veth not in links_in(agent.netns)
    await recycle_once(controller.service, controller.neutron, controller.settings.pool)
    key = PoolKey(node.name, vxnet.project_id, vxnet.id)
    assert orphan in pooled_ports(_Running(controller), key)  # back in the pool

    delete = await acni(plugin, "DEL", agent.conf(vxnet.id), container_id=kept_cid)
    assert delete.code == 0, delete.stdout


class _Running:
    """What ``pooled_ports`` reads from a running controller."""

    def __init__(self, controller: Controller) -> None:
        self.service = controller.service


async def test_del_succeeds_for_every_id_add_accepted(
    pooled: tuple[Controller, HostAgent, Node],
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
) -> None:
    """The runtime's DEL after an ADD that refused the container id or ifname (nothing can
    exist under it), and a DEL whose netns is missing, stale or gone, must succeed (CNI spec:
    DEL cleans up whatever is there; a failing DEL is retried by the runtime forever)."""
    controller, agent, node = pooled
    ns = netenv.namespace("del")
    conf = agent.conf(vxnet.id)
    for cid, ifname in (("c" * 238, "eth0"), ("cdel", "eth@1"), ("cdel", "nét1")):
        add = await acni(
            plugin, "ADD", conf, container_id=cid, netns=f"/run/netns/{ns}", ifname=ifname
        )
        assert add.code == spec.INVALID_ENV, add.stdout  # not a name podwire attaches
        assert links_in(ns) == ["lo"]
        delete = await acni(plugin, "DEL", conf, container_id=cid, ifname=ifname)
        assert delete.code == 0, (cid[:8], ifname, delete.stdout)

    cid = uuid.uuid4().hex
    add = await acni(plugin, "ADD", conf, container_id=cid, netns=f"/run/netns/{ns}")
    assert add.code == 0, add.stdout
    for netns in ("", "relative/path", f"/run/netns/{ns}-gone"):
        delete = await acni(plugin, "DEL", conf, container_id=cid, netns=netns)
        assert delete.code == 0, (netns, delete.stdout)
    assert controller.service.term.attachments.vifs_of_node(node.name) == {}
    assert links_in(ns) == ["lo"]
