"""Values a node writes under its own prefix, read by a running controller (#44): whatever a
node writes there, the controller keeps serving every node, and that node's requests get a
clear answer (the real controller, etcd and Neutron)."""

from __future__ import annotations

from typing import Any

import aiohttp

from podwire import keys
from tests.controller.conftest import ScriptedNodes, request_vif, settings_for, vif_body

HOSTILE = [
    b"", b"{", b"\xff\xfe", b"null", b"[]", b'{"v": 2}', b"x" * 70000,
    b'{"v": 1, "vif_types": ["veth"], "network_types": ["vxlan"], "pod_driver": "evil"}',
    b'{"v": 1, "started_at": 1e300}', b'{"v": 1, "started_at": 1, "beat_at": "soon", "ttl": 5}',
]  # fmt: skip


async def test_a_nodes_junk_never_stops_the_controller(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    honest, hostile = await nodes.add(), await nodes.add()
    running = await controllers(settings_for(stack, [honest, hostile], min=0))
    for n, junk in enumerate(HOSTILE):
        for key in (keys.state_capabilities(hostile.name), keys.state_alive(hostile.name),
                    keys.state_physnet(hostile.name, "physnet1")):  # fmt: skip
            await nodes.etcd.put(key, junk)
        status, answer = await request_vif(
            http, running.url, hostile, vif_body(f"h{n}:eth0", network)
        )
        assert status in (200, 409, 503), answer  # served, or refused with its reason
        if status != 200:
            assert answer["error"], answer
        status, answer = await request_vif(
            http, running.url, honest, vif_body(f"o{n}:eth0", network)
        )
        assert status == 200, answer
        assert not running.task.done()
    assert not running.task.done()
