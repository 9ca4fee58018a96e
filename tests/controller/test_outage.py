"""A Neutron outage during refill: requests fail retryably, nothing leaks once it is back."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from podwire.schema.inuse import PoolKey
from tests.controller.conftest import (
    ScriptedNodes,
    pooled_ports,
    request_vif,
    settings_for,
    vif_body,
)


class CuttableProxy:
    """A TCP proxy to Neutron that can be cut (connections reset, port closed) and restored."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers.update({writer, up_writer})
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()


async def test_outage_during_refill_is_retryable_and_leaks_nothing(
    stack: dict[str, Any],
    neutron: Any,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    proxy = CuttableProxy(stack["neutron"])
    await proxy.start()
    node = await nodes.add()
    settings = settings_for(
        stack, [node], endpoint=f"http://127.0.0.1:{proxy.port}/", min=0, batch=2
    )
    running = await controllers(settings)
    for name in ("a:eth0", "b:eth0"):
        status, _ = await request_vif(http, running.url, node, vif_body(name, network))
        assert status == 200
    key = PoolKey(node.name, network.project_id, network.id)
    assert running.service.pools.size(key) == 0
    await proxy.cut()
    status, body = await request_vif(http, running.url, node, vif_body("c:eth0", network))
    assert status == 503 and body["retryable"] is True
    assert running.controller.metrics.neutron_errors.labels("create_ports")._value.get() >= 1
    await proxy.start()
    status, _ = await request_vif(http, running.url, node, vif_body("c:eth0", network))
    assert status == 200
    await running.service.drain()
    ours = {p.id for p in neutron.network.ports(network_id=network.id)}
    in_use = {r.vif.port_id for r in running.service.attachments.values()}
    pooled = pooled_ports(running, key)
    assert ours == in_use | pooled and len(in_use) == 3
