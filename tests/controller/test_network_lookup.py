"""A request's network named by its name is looked up in Neutron once, like one named by its
id: warm requests make no Neutron call either way."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.controller.conftest import ScriptedNodes, request_vif, settings_for, vif_body

pytestmark = pytest.mark.stack


def _lookups(running: Any) -> float:
    calls = running.controller.metrics.neutron_calls
    return sum(calls.labels(op)._value.get() for op in ("list_networks", "list_subnets"))


async def test_a_network_name_is_resolved_once(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=2, batch=4))
    by_name = {**vif_body("a:eth0", network), "network": network.name}
    status, first = await request_vif(http, running.url, node, by_name)
    assert status == 200 and first["vif"]["network_id"] == network.id, first
    looked_up = _lookups(running)
    for index in range(3):
        again = {**vif_body(f"n{index}:eth0", network), "network": network.name}
        status, answer = await request_vif(http, running.url, node, again)
        assert status == 200 and answer["vif"]["network_id"] == network.id, answer
    assert _lookups(running) == looked_up
    # Another project's request for that name is resolved for that project, not from the cache.
    other = {**vif_body("o:eth0", network), "network": network.name, "project_id": "f" * 32}
    status, answer = await request_vif(http, running.url, node, other)
    assert status == 404 and answer["cause"] == "unknown_network", answer
