"""A reverse proxy in front of Neutron that counts the API requests passing through it.

The honest count of what a path costs Neutron: every request is seen, whichever podwire
module or openstacksdk call sent it (lists included), and a reference sent through the same
proxy is counted the same way. Version discovery (``GET /`` and ``GET /v2.0/``) is passed on
but not counted: a client does it once per connection.

``refusing`` answers some requests itself, in Neutron's words, instead of passing them on:
how the tests meet a refusal the real Neutron cannot be made to give (it has no quota on
address groups).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
DISCOVERY = {"/", "/v2.0", "/v2.0/"}


class NeutronCounter:
    """Start it in the bench's event loop; ``endpoint`` is what clients are given."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.counts: collections.Counter[str] = collections.Counter()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.endpoint = ""
        # (method, path) -> Neutron's refusal to answer with, or None to pass the request on.
        self.refusing: Callable[[str, str], web.Response | None] | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    async def start(self) -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.endpoint = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        if request.path not in DISCOVERY:
            self.counts[f"{request.method} {_kind(request.path)}"] += 1
        refusal = self.refusing(request.method, request.path) if self.refusing else None
        if refusal is not None:
            return refusal
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.raw_path_qs,
            headers=headers,
            data=await request.read(),
        ) as answer:
            body = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS}
            return web.Response(status=answer.status, body=body, headers=kept)


def _kind(path: str) -> str:
    """The resource a request is about, without ids: ``/v2.0/ports/<id>`` -> ``ports``."""
    parts = [p for p in path.split("/") if p and p != "v2.0"]
    words = [p for p in parts if not _looks_like_id(p)]
    return "/".join(words) or "/"


def _looks_like_id(part: Any) -> bool:
    return len(part) >= 32 and all(c in "0123456789abcdef-" for c in part.lower())


def over_quota(resource: str) -> web.Response:
    """Neutron's own answer to a create over its project's quota."""
    message = f"Quota exceeded for resources: ['{resource}']."
    error = {"NeutronError": {"type": "OverQuota", "message": message, "detail": ""}}
    return web.json_response(error, status=409)
