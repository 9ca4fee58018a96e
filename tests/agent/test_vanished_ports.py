"""Pooled ports Neutron deletes never fail an ADD: not when they were deleted while pooled,
and not when one goes between the controller's answer and its wiring on the node (the agent
asks for another). The real controller, agent, plugin, Neutron and forwarder."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.agent.vifs.controller_vifs import ControllerVifSource
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.schema.inuse import PoolKey
from podwire.schema.vif import Vif, VifRequest
from tests.agent.harness import HostAgent, acni
from tests.agent.netenv import NetEnv
from tests.agent.test_with_controller import pooled  # noqa: F401  (the fixture)
from tests.controller.conftest import Node
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack


async def _pool_of(controller: Controller, key: PoolKey, count: int, agent: HostAgent) -> set[str]:
    await controller.admin.populate([key.node], key.network_id, key.project_id, [], count)
    pools = controller.service.pools

    async def ready() -> bool:
        free = {p for _, ports in pools.groups(key) for p in ports}
        binder = agent.agent.parts.binder if agent.agent is not None else None
        return len(free) == count and binder is not None and free <= set(binder.wired)

    await eventually(ready, f"{count} pooled ports wired on the node", timeout=30)
    return {p for _, ports in pools.groups(key) for p in ports}


async def _add(plugin: Path, agent: HostAgent, netenv: NetEnv, network: Any) -> tuple[Any, str]:
    ns = netenv.namespace(uuid.uuid4().hex[:6])
    cid = uuid.uuid4().hex
    result = await acni(
        plugin, "ADD", agent.conf(network.id), container_id=cid, netns=f"/run/netns/{ns}"
    )
    return result, cid


async def test_ports_deleted_in_neutron_are_not_handed_out(
    pooled: tuple[Controller, HostAgent, Node],  # noqa: F811
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
) -> None:
    """At once after the deletes, no ADD fails (a port handed out in the milliseconds before
    the controller saw its delete is replaced by the agent, or was wired before it went);
    once the pool agrees with Neutron (bench/pool_sync_bench.py: milliseconds), no ADD gets
    a deleted port."""
    controller, agent, node = pooled
    key = PoolKey(node.name, vxnet.project_id, vxnet.id)
    ports = sorted(await _pool_of(controller, key, 6, agent))
    deleted = ports[:4]
    for port_id in deleted:
        neutron.network.delete_port(port_id)
    results = await asyncio.gather(*(_add(plugin, agent, netenv, vxnet) for _ in range(2)))
    assert [r.code for r, _ in results] == [0, 0], [r.stdout for r, _ in results]

    async def agreed() -> bool:
        pools = controller.service.pools
        return all(pools.pool_of(port_id) is None for port_id in deleted)

    await eventually(agreed, "the deleted ports out of the pool", timeout=10)
    later = await asyncio.gather(*(_add(plugin, agent, netenv, vxnet) for _ in range(3)))
    assert [r.code for r, _ in later] == [0, 0, 0], [r.stdout for r, _ in later]
    held = controller.service.term.attachments.vifs_of_node(node.name)
    assert {held[f"{cid}:eth0"].port_id for _, cid in later}.isdisjoint(deleted)


async def test_a_port_deleted_between_answer_and_wiring_is_replaced(
    pooled: tuple[Controller, HostAgent, Node],  # noqa: F811
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    etcd: EtcdClient,
) -> None:
    controller, agent, node = pooled
    key = PoolKey(node.name, vxnet.project_id, vxnet.id)
    await _pool_of(controller, key, 2, agent)
    source = agent.vifs
    assert isinstance(source, ControllerVifSource)
    answer = source.request
    vanished: list[str] = []

    async def answer_then_delete(req: VifRequest, deadline: float) -> Vif:
        """The controller's answer reaches the agent just after Neutron deleted the port and
        the node unwired it (the forwarder was faster than the controller's watch)."""
        vif = await answer(req, deadline)
        if not vanished:
            vanished.append(vif.port_id)
            neutron.network.delete_port(vif.port_id)
            state = keys.state_port(node.name, vif.port_id)
            await eventually(lambda: _absent(etcd, state), "the node unwired the port")
        return vif

    source.request = answer_then_delete  # type: ignore[method-assign]
    result, cid = await _add(plugin, agent, netenv, vxnet)
    assert result.code == 0, result.stdout
    held = controller.service.term.attachments.vifs_of_node(node.name)[f"{cid}:eth0"]
    assert vanished and held.port_id != vanished[0]
    assert result.json["interfaces"][1]["mac"] == held.mac_address


async def _absent(etcd: EtcdClient, key: str) -> bool:
    return await etcd.get(key) is None
