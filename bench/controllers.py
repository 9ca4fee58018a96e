"""A controller in the bench's own event loop, serving before the bench goes on; its settings
and the nodes it serves, registered as their agents would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from bench.harness import running
from podwire import keys
from podwire.config import ControllerSettings, EtcdSettings, NeutronSettings, PoolSettings, Settings
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import connect

# A pool that moves only when asked: no refill, recycling or node cleanup pass of its own.
QUIET_POOL = PoolSettings(
    min=0, batch=50, adaptive=False, update_interval=3600.0, node_cleanup_interval=3600.0
)


def controller_settings(
    stack: dict[str, Any],
    tokens: dict[str, str],
    pool: PoolSettings | None = None,
    etcd: EtcdSettings | None = None,
    admin: str = "a",
) -> Settings:
    """The stack's etcd (or ``etcd``) and Neutron; ``tokens``: each node's bearer token."""
    return Settings(
        etcd=etcd or EtcdSettings(endpoints=[stack["etcd"]]),
        neutron=NeutronSettings(endpoint=stack["neutron"]),
        controller=ControllerSettings(listen="127.0.0.1:0", admin_token=admin, node_tokens=tokens),
        pool=pool or PoolSettings(),
    )


async def register_node(etcd: EtcdClient, node: str, driver: str | None = None) -> None:
    """A live node as its agent announces itself: VTEP, capabilities (``driver``: its pod
    driver), a heartbeat on an hour's lease."""
    await etcd.put(keys.state_vtep(node), b'{"v":1,"ip":"192.0.2.10"}')
    caps: dict[str, Any] = {"v": 1, "vif_types": ["veth"], "network_types": ["vxlan"]}
    if driver is not None:
        caps["pod_driver"] = driver
    await etcd.put(keys.state_capabilities(node), json.dumps(caps).encode())
    lease = await etcd.grant_lease(3600)
    alive = json.dumps({"v": 1, "started_at": time.time(), "version": "bench"}).encode()
    await etcd.put(keys.state_alive(node), alive, lease=lease.id)


@contextlib.asynccontextmanager
async def serving_controller(settings: Settings, etcd: EtcdClient) -> AsyncIterator[Controller]:
    controller = Controller(settings, etcd, connect(settings.neutron))
    async with running(controller.run()) as task:
        async with asyncio.timeout(120):
            while not controller.service.serving:
                if task.done():
                    task.result()  # it failed: say why
                await asyncio.sleep(0.05)
        yield controller
