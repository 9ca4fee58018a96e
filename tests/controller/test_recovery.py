"""Recovery against the real stack: from the forwarder's mirror (then verified against
Neutron), and from a Neutron listing when the mirror cannot be trusted."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from typing import Any

import aiohttp

from podwire import keys
from podwire.controller.mirror import forwarder_doubt
from podwire.controller.recovery import LEFTOVER_MARGIN, verify
from podwire.etcd.client import EtcdClient
from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ScriptedNodes,
    eventually,
    pooled_ports,
    request_vif,
    settings_for,
    vif_body,
)
from tests.neutron_calls import neutron_call_count


async def _mirror_trusted(etcd: EtcdClient) -> bool:
    status = await etcd.get(keys.status("ml2"))
    return forwarder_doubt(status.value if status else None, time.time()) is None


async def test_recovery_from_the_mirror_is_verified_against_neutron(
    stack: dict[str, Any],
    etcd: EtcdClient,
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    settings = settings_for(stack, [node], min=3, batch=3)
    first = await controllers(settings)
    _, used = await request_vif(http, first.url, node, vif_body("u1:eth0", network))
    await first.service.drain()
    key = PoolKey(node.name, network.project_id, network.id)
    free = pooled_ports(first, key)
    await first.stop()
    await eventually(lambda: _mirror_trusted(etcd), "the ml2 forwarder vouches for the mirror")

    second = await controllers(settings)
    report = second.controller.recovery
    assert report.source == "etcd"
    assert pooled_ports(second, key) == free and used["vif"]["port_id"] not in free
    _, again = await request_vif(http, second.url, node, vif_body("u1:eth0", network))
    assert again["vif"] == used["vif"]

    async def verified() -> bool:
        return bool(report.verified)

    await eventually(verified, "background verification")
    calls = neutron_call_count(second.controller.metrics)
    await second.service.neutron.network(network.id, None)  # cached by the verification
    assert neutron_call_count(second.controller.metrics) == calls
    # An unbound port of ours younger than the margin could be one being created right now,
    # so it stays (made after the recovery started: the test's pace cannot age it).
    leftover = neutron.network.create_port(
        network_id=network.id, project_id=network.project_id, device_owner="compute:podwire"
    )
    await verify(second.service, second.controller.neutron, replace(report, verified=False))
    assert neutron.network.find_port(leftover.id) is not None
    # A pooled port deleted behind the controller's back is dropped on verification.
    gone = sorted(free)[0]
    neutron.network.delete_port(gone)
    later = replace(report, started_at=time.time() + LEFTOVER_MARGIN + 1, verified=False)
    await verify(second.service, second.controller.neutron, later)
    assert neutron.network.find_port(leftover.id) is None
    assert pooled_ports(second, key) == free - {gone}
    assert not second.service.pools.known(gone)


async def test_recovery_lists_neutron_when_the_mirror_is_incomplete(
    stack: dict[str, Any],
    etcd: EtcdClient,
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
) -> None:
    node = await nodes.add()
    settings = settings_for(stack, [node], min=2, batch=2)
    first = await controllers(settings)
    await first.service.drain()
    key = PoolKey(node.name, network.project_id, network.id)
    free = pooled_ports(first, key)
    await first.stop()
    # An entry of ours written by an older ml2 driver (no project): the mirror cannot say
    # which pool the port belongs to, so recovery must not use it at all.
    old = {"v": 1, "port_id": str(uuid.uuid4()), "network_id": network.id, "mtu": 1450,
           "mac_address": "fa:16:3e:00:00:99", "network_type": "vxlan", "vif_type": "veth",
           "fixed_ips": [], "device_owner": "compute:podwire"}  # fmt: skip
    old_key = keys.node_port(node.name, old["port_id"])
    await etcd.put(old_key, json.dumps(old).encode())
    leftover = neutron.network.create_port(
        network_id=network.id, project_id=network.project_id, device_owner="compute:podwire"
    )
    try:
        second = await controllers(settings)
    finally:
        await etcd.delete(old_key)
    assert second.controller.recovery.source == "neutron"
    assert pooled_ports(second, key) == free
    # Listed before serving, so leftovers go at once, however young.
    assert neutron.network.find_port(leftover.id) is None
