"""A node removed from the cluster, or dead for ``pool.node_release_after``, releases all it
held: its in-use ports are deleted in Neutron (their addresses can be taken at once), their
records leave etcd and its pools are freed. Real controller, etcd and Neutron; the node is
scripted (alive key, capabilities), its pods are attachments holding ports."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.etcd.client import EtcdClient
from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ADMIN,
    ScriptedNodes,
    admin,
    eventually,
    request_vif,
    settings_for,
    vif_body,
)

pytestmark = pytest.mark.stack

PODWIRE = Path(sys.executable).with_name("podwire")


async def _pods(http: aiohttp.ClientSession, url: str, node: Any, network: Any) -> list[Any]:
    vifs = []
    for index in range(3):
        status, got = await request_vif(http, url, node, vif_body(f"c{index}:eth0", network))
        assert status == 200, got
        vifs.append(got["vif"])
    return vifs


def _ports_of(neutron: Any, network: Any, node: Any) -> set[str]:
    return {
        str(p.id)
        for p in neutron.network.ports(network_id=network.id)
        if p.binding_host_id == node.name
    }


async def _released_everything(
    neutron: Any, etcd: EtcdClient, running: Any, network: Any, node: Any, vifs: list[Any]
) -> None:
    assert _ports_of(neutron, network, node) == set()  # pool ports and in-use ones
    records, _ = await etcd.get_prefix(keys.vifs_prefix(node.name))
    assert records == []
    assert running.service.term.attachments.vifs_of_node(node.name) == {}
    key = PoolKey(node.name, network.project_id, network.id)
    assert key not in running.service.pool_keys()
    # The addresses are free: another port takes one of them at once.
    ip, subnet = vifs[0]["fixed_ips"][0]["ip_address"], vifs[0]["fixed_ips"][0]["subnet_id"]
    taker = neutron.network.create_port(
        network_id=network.id,
        project_id=network.project_id,
        fixed_ips=[{"subnet_id": subnet, "ip_address": ip}],
    )
    neutron.network.delete_port(taker)


async def test_nodes_remove_releases_a_nodes_ports_at_once(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
    neutron: Any,
    etcd: EtcdClient,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=2, batch=2))
    vifs = await _pods(http, running.url, node, network)
    await running.service.drain()  # the pool's refill is in too
    assert len(_ports_of(neutron, network, node)) >= 4
    proc = await asyncio.create_subprocess_exec(
        str(PODWIRE), "nodes", "remove", node.name, "--url", running.url, "--token", ADMIN,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    answer = json.loads(out)
    assert answer == {"node": node.name, "released": sorted(v["port_id"] for v in vifs)}
    await _released_everything(neutron, etcd, running, network, node, vifs)
    # Removing it again is harmless; a release its agent sends late finds nothing.
    status, body = await admin(http, "DELETE", f"{running.url}/v1/nodes/{node.name}")
    assert (status, body["released"]) == (200, []), body
    metric = running.controller.metrics.nodes_released.labels("removed")._value.get()
    assert metric == 2


async def test_a_node_dead_for_node_release_after_releases_its_ports(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
    neutron: Any,
    etcd: EtcdClient,
) -> None:
    node, survivor = await nodes.add(), await nodes.add()
    settings = settings_for(stack, [node, survivor], min=0, node_release_after=1.0)
    running = await controllers(settings)
    vifs = await _pods(http, running.url, node, network)
    kept = await _pods(http, running.url, survivor, network)
    sweeper = running.controller.sweeper
    await nodes.kill(node)  # its agent is gone: the alive key's lease revoked
    await sweeper.sweep_once()  # found dead: the clock starts
    assert (
        len(running.service.term.attachments.vifs_of_node(node.name)) == 3
    )  # a restart is no death

    async def released() -> bool:
        await sweeper.sweep_once()
        return not running.service.term.attachments.vifs_of_node(node.name)

    await eventually(released, "the dead node released")
    await _released_everything(neutron, etcd, running, network, node, vifs)
    assert running.controller.metrics.nodes_released.labels("dead")._value.get() == 1
    held = running.service.term.attachments.vifs_of_node(survivor.name)
    assert sorted(v.port_id for v in held.values()) == sorted(v["port_id"] for v in kept)
    assert _ports_of(neutron, network, survivor) == {v["port_id"] for v in kept}
