"""Active/standby when the leader crashes: no lease revocation, the standby waits for expiry.

The leader is the real ``podwire controller`` process (started like the demo starts it) and dies
by SIGKILL, so its election key stays until its lease runs out. The controller CLI has no
election TTL setting: the leader's lease has the built-in 10 s TTL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.controller.leader import ELECTION
from podwire.controller.recycler import recycle_once
from podwire.demo.services import Services
from podwire.etcd.client import EtcdClient
from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ADMIN,
    ScriptedNodes,
    admin,
    eventually,
    pooled_ports,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)


def project_ports(neutron: Any, project_id: str) -> set[str]:
    return {str(p.id) for p in neutron.network.ports(project_id=project_id)}


@pytest.mark.slow
async def test_standby_takes_over_from_crashed_leader_after_lease_expiry(
    stack: dict[str, Any],
    etcd: EtcdClient,
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    node = await nodes.add()
    before = project_ports(neutron, network.project_id)
    key = PoolKey(node.name, network.project_id, network.id)
    services = Services(tmp_path, stack["etcd"], stack["neutron"], admin_token=ADMIN)
    try:
        # the leader: a real controller process (pool.min 0, batch 10)
        await asyncio.to_thread(services.start_controller, [node.name])
        node.token = services.node_tokens[node.name]
        leader = services.children["controller"]
        elected = await etcd.get(ELECTION)
        assert elected is not None and elected.lease != 0
        assert json.loads(elected.value)["identity"].endswith(f":{leader.pid}")
        settings = settings_for(stack, [node], min=0, batch=10)
        standby = await controllers(settings, wait_ready=False)

        status, used = await request_vif(
            http, services.controller_url, node, vif_body("c:eth0", network)
        )
        assert status == 200
        used_port = used["vif"]["port_id"]
        status, pool = await admin(
            http,
            "GET",
            f"{services.controller_url}/v1/pools/{node.name}/{network.project_id}/{network.id}",
        )
        assert status == 200
        free = {p for group in pool["groups"] for p in group["ports"]}
        assert len(free) == 9 and used_port not in free
        assert project_ports(neutron, network.project_id) == before | free | {used_port}
        assert not standby.service.serving

        os.kill(leader.pid, signal.SIGKILL)
        assert await asyncio.to_thread(leader.wait) == -signal.SIGKILL

        # the standby must not lead while the crashed leader's key (and lease) is still there
        old_key_seen = 0

        async def took_over() -> bool:
            nonlocal old_key_seen
            leading = standby.service.serving or standby.controller.leadership.lease is not None
            current = await etcd.get(ELECTION)
            if current is not None and current.lease == elected.lease:
                assert not leading, "standby leads while the crashed leader's key still exists"
                old_key_seen += 1
            return bool(standby.service.serving)

        await eventually(took_over, "standby took over after the lease expired", timeout=60)
        assert old_key_seen > 0, "the takeover was instant: the old key was never seen"
        current = await etcd.get(ELECTION)
        assert current is not None
        assert current.lease == standby.controller.leadership.lease.id != elected.lease
        assert current.create_revision > elected.mod_revision

        # recovered: the in-use attachment and exactly the crashed leader's free ports
        assert pooled_ports(standby, key) == free
        assert project_ports(neutron, network.project_id) == before | free | {used_port}
        status, again = await request_vif(http, standby.url, node, vif_body("c:eth0", network))
        assert status == 200 and again["vif"] == used["vif"]
        # new requests are served from the recovered pool
        status, fresh = await request_vif(http, standby.url, node, vif_body("d:eth0", network))
        assert status == 200 and fresh["vif"]["port_id"] in free
        assert standby.service.pools.size(key) == 8
        # releases work for the recovered attachment and the new one; both are recycled
        assert await release_vif(http, standby.url, node, "c:eth0") == 204
        assert await release_vif(http, standby.url, node, "d:eth0") == 204
        assert await recycle_once(standby.service, standby.controller.neutron, settings.pool) == (
            2,
            0,
        )
        assert standby.service.pools.size(key) == 10
        assert (await etcd.get_prefix(keys.vifs_prefix(node.name)))[0] == []
        status, freed = await admin(
            http, "POST", standby.url + "/v1/pools/free", {"nodes": [node.name]}
        )
        assert status == 200 and freed == {"freed": 10}
    finally:
        await asyncio.to_thread(services.stop)
    assert project_ports(neutron, network.project_id) == before
