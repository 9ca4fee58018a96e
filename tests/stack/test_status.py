"""``podwire status`` against the real stack, and with etcd down."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

from podwire.stack.netutil import free_port
from tests.conftest import PODWIRE
from tests.scripted_agent import ScriptedAgent, eventually


def status(etcd_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PODWIRE_ETCD_ENDPOINTS": etcd_url, "PODWIRE_ETCD_TIMEOUT": "2"}
    return subprocess.run(
        [*PODWIRE, "status", *args], capture_output=True, text=True, env=env, timeout=60
    )


async def test_status_shows_nodes_forwarder_and_feedback(
    stack: dict[str, Any], agents: Callable[[], ScriptedAgent]
) -> None:
    alive, dead = agents(), agents()
    await alive.register(physnets={"physnet1": "eth1"}, vtep="192.0.2.77")
    await dead.register(alive=False)

    async def reported() -> dict[str, Any] | None:
        result = await asyncio.to_thread(status, stack["etcd"], "--json")
        body: dict[str, Any] = json.loads(result.stdout)
        return body if body["ml2"].get("state") == "ok" else None

    body = await eventually(reported, "the forwarder's status report")
    nodes = {node["host"]: node for node in body["nodes"]}
    assert nodes[alive.host]["alive"] and nodes[alive.host]["vtep"] == "192.0.2.77"
    assert nodes[alive.host]["physnets"] == {"physnet1": "eth1"}
    assert not nodes[dead.host]["alive"]
    assert f"node {dead.host} is not alive" in body["problems"]
    assert body["leaders"]["forwarder"] == body["ml2"]["forwarder"]
    assert body["ml2"]["feedback_revision"] > 0

    text = await asyncio.to_thread(status, stack["etcd"])
    assert text.returncode == 0
    assert alive.host in text.stdout and "192.0.2.77" in text.stdout
    assert "PROBLEMS" in text.stdout


def test_status_when_etcd_is_down() -> None:
    result = status(f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert result.stdout.startswith("etcd: UNREACHABLE")
    assert "Traceback" not in result.stderr
    body = json.loads(status(f"http://127.0.0.1:{free_port()}", "--json").stdout)
    assert body["etcd"]["state"] == "unreachable"
