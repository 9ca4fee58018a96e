"""Neutron frozen for 30 s (SIGSTOP, like a hung host: connections open, nothing answers):
the controller keeps its term, its readiness names Neutron, a term that starts meanwhile
waits in recovery instead of re-electing, and everything serves again once Neutron is back.

The neutron-server is one of this module's own stack (freezing the session's would stall every
other test); its forwarder freezes with it, as it would in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire.config import EtcdSettings
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect, neutron_connection
from podwire.stack.client import start_background, stop_background
from tests.controller.conftest import ScriptedNodes, request_vif, settings_for, vif_body
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.slow]

FROZEN = 30.0


@pytest.fixture(scope="module")
def own_stack(work_dir: Path) -> Iterator[dict[str, Any]]:
    proc, info = start_background(work_dir / "neutron-stall")
    try:
        yield info
    finally:
        stop_background(proc)


@pytest.fixture
async def own_etcd(own_stack: dict[str, Any]) -> AsyncIterator[EtcdClient]:
    client = await EtcdClient.connect(EtcdSettings(endpoints=[own_stack["etcd"]]))
    yield client
    await client.close()


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (gunicorn's master and its workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parent = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


async def test_a_frozen_neutron_keeps_the_term_and_is_named(
    own_stack: dict[str, Any], own_etcd: EtcdClient
) -> None:
    neutron = neutron_connection(own_stack["neutron"])
    project = uuid.uuid4().hex
    network = neutron.network.create_network(project_id=project, name="pw-stall")
    neutron.network.create_subnet(
        project_id=project, network_id=network.id, cidr="10.90.0.0/24", ip_version=4
    )
    nodes = ScriptedNodes(own_etcd)
    node = await nodes.add()
    settings = settings_for(own_stack, [node], min=2, batch=2)
    controller = Controller(settings, own_etcd, connect(settings.neutron))
    task = asyncio.create_task(controller.run())
    neutron_pids = _tree(int(own_stack["pids"]["neutron"]))
    try:
        await eventually(lambda: _serving(controller, task), "controller serving", timeout=60)
        url = f"http://127.0.0.1:{controller.port}"
        async with aiohttp.ClientSession() as http:
            status, _ = await request_vif(http, url, node, vif_body("before:eth0", network))
            assert status == 200
            await controller.service.drain()  # its refill done: nothing of it in flight

            _signal(neutron_pids, signal.SIGSTOP)
            thawed = False
            try:
                details = await _watch(controller, FROZEN / 2)
                assert any("neutron: no answer for" in d for d in details), details[-3:]
                assert controller.leadership.terms == 1 and controller.leadership.losses == 0
                # A term that starts now (its lease lost) must wait for Neutron in recovery.
                lease = controller.leadership.lease
                assert lease is not None
                await lease.revoke()
                details = await _watch(controller, FROZEN / 2)
                assert any("recovering pools: neutron: no answer for" in d for d in details)
                assert controller.leadership.terms == 2  # the one the test ended, no more
            finally:
                _signal(neutron_pids, signal.SIGCONT)
                thawed = True
            assert thawed
            await eventually(lambda: _serving(controller, task), "serving again", timeout=90)
            status, body = await request_vif(http, url, node, vif_body("after:eth0", network))
            assert status == 200, body
            assert controller.leadership.terms == 2
        _, detail = await controller.ready()
        assert "neutron" not in detail, detail
    finally:
        _signal(neutron_pids, signal.SIGCONT)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await nodes.cleanup()
        for port in list(neutron.network.ports(project_id=project)):
            neutron.network.delete_port(port)
        neutron.network.delete_network(network)


async def _watch(controller: Controller, seconds: float) -> list[str]:
    """Readiness every half second for ``seconds``."""
    details = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        details.append((await controller.ready())[1])
        await asyncio.sleep(0.5)
    return details


async def _serving(controller: Controller, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()
    return controller.service.serving
