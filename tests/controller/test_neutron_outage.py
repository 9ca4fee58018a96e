"""Neutron away, etcd fine: the controller keeps its term (no re-election storm) and its
readiness names Neutron. Here Neutron refuses connections (nothing listens on its port);
tests/healing/test_neutron_stall.py freezes a real neutron-server of its own."""

from __future__ import annotations

import asyncio
import contextlib
import re

from podwire.config import EtcdSettings
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect
from podwire.stack.netutil import free_port
from tests.controller.conftest import Node, settings_for
from tests.etcd.conftest import PrivateEtcd, private_etcd  # noqa: F401  (the fixture)
from tests.scripted_agent import eventually


async def test_an_unreachable_neutron_keeps_the_term_and_is_named(
    private_etcd: PrivateEtcd,  # noqa: F811  (no forwarder reports there: recovery lists Neutron)
) -> None:
    node = Node("n-outage", "t")
    dead = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
    settings = settings_for({}, [node], endpoint=dead, min=0)
    etcd = await EtcdClient.connect(EtcdSettings(endpoints=[private_etcd.server.client_url]))
    controller = Controller(settings, etcd, connect(settings.neutron), election_ttl=5)
    task = asyncio.create_task(controller.run())
    try:

        async def named() -> bool:
            ready, detail = await controller.ready()
            return not ready and "recovering pools: neutron:" in detail

        await eventually(named, "readiness naming Neutron", timeout=30)
        terms = controller.leadership.terms
        await asyncio.sleep(6)  # main re-elected itself every 0.2-0.4 s here
        assert controller.leadership.terms == terms == 1
        assert controller.leadership.losses == 0 and controller.leadership.is_leader
        _, detail = await controller.ready()
        # what failed (recovery's first listing), and why
        assert re.search(r"neutron: neutron list (trunks|ports): Unable to", detail), detail
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await etcd.close()
