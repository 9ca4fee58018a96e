"""``/healthz``, ``/readyz`` and ``/metrics`` for a podwire service, on aiohttp.

Liveness says the process is serving; readiness asks the service (e.g. "recovery finished",
"etcd reachable") through a callback, so an orchestrator does not send work too early.
A service with its own aiohttp app (the controller) mounts these routes with
``add_ops_routes``; the agent, which has none, starts ``OpsServer`` on a separate listen
address. The device plugin starts none: embedded, its stats are read onto the agent's
registry; alone, it has no ops endpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client
from aiohttp import web

ReadyCheck = Callable[[], Awaitable[tuple[bool, str]]]
# What liveness adds to its answer (e.g. parts restarted after a failure): still live, since
# the process restarts its own parts, but an operator sees it.
LiveDetail = Callable[[], dict[str, Any]]


def add_ops_routes(
    app: web.Application,
    ready: ReadyCheck,
    registry: prometheus_client.CollectorRegistry = prometheus_client.REGISTRY,
    live: LiveDetail | None = None,
) -> None:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **(live() if live is not None else {})})

    async def readyz(_: web.Request) -> web.Response:
        is_ready, detail = await ready()
        body = {"status": "ready" if is_ready else "not ready", "detail": detail}
        return web.json_response(body, status=200 if is_ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        payload = prometheus_client.generate_latest(registry)
        return web.Response(
            body=payload, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST}
        )

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


class OpsServer:
    """A stand-alone ops endpoint on ``host:port``; ``start``/``stop`` around a service's life."""

    def __init__(
        self,
        listen: str,
        ready: ReadyCheck,
        registry: prometheus_client.CollectorRegistry = prometheus_client.REGISTRY,
        live: LiveDetail | None = None,
    ) -> None:
        host, _, port = listen.rpartition(":")
        self._host, self._port = host, int(port)
        self._app = web.Application()
        add_ops_routes(self._app, ready, registry, live)
        self._runner = web.AppRunner(self._app, access_log=None)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0 in tests)."""
        for site in self._runner.sites:
            server = getattr(site, "_server", None)
            if server is not None and server.sockets:
                return int(server.sockets[0].getsockname()[1])
        return self._port

    async def start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()

    async def stop(self) -> None:
        await self._runner.cleanup()
