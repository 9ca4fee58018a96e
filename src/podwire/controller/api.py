"""The controller's HTTP face: VIF API (node tokens), admin API (admin token), OpenAPI, ops.

Errors leave as JSON ``{"error": <message>, "retryable": <bool>, "cause": <kind>}`` with one
status per error kind; retryable ones carry ``Retry-After`` so agents back off (and may try
another controller).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from podwire import __version__
from podwire.config import ControllerSettings
from podwire.controller import openapi, validate
from podwire.controller.errors import (
    Forbidden,
    NotServing,
    Unauthorized,
    Unusable,
)
from podwire.controller.pool_admin import PoolAdmin
from podwire.controller.pool_service import PoolService, PoolSnapshot
from podwire.controller.term import TermGuard
from podwire.controller.vif_broker import VifBroker
from podwire.errors import PermanentError, PodwireError, UnknownResource, ValidationError
from podwire.log import get_logger
from podwire.neutron.client import NeutronNotFound, NeutronRequestError
from podwire.ops_http import ReadyCheck, add_ops_routes
from podwire.schema import doc, fields
from podwire.schema.inuse import PoolKey
from podwire.schema.vif import VifRequest

log = get_logger(__name__)

MAX_BODY = 64 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NodeHandler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]


def _status(exc: PodwireError) -> int:
    if exc.retryable:
        return 503
    for kind, status in (
        (Unauthorized, 401),
        (Forbidden, 403),
        (UnknownResource, 404),
        (Unusable, 409),
        (NeutronNotFound, 404),
        (ValidationError, 400),
    ):
        if isinstance(exc, kind):
            return status
    if isinstance(exc, NeutronRequestError):
        return exc.status if 400 <= exc.status < 500 else 400
    return 400 if isinstance(exc, PermanentError) else 500


def error_response(
    status: int, message: str, cause: str, retryable: bool = False, leader: str = ""
) -> web.Response:
    """The one shape of every failure (docs/vif-api.md): message, retryable, cause; a
    standby's also says where the leader serves."""
    body: dict[str, Any] = {"error": message or cause, "retryable": retryable, "cause": cause}
    if leader:
        body["leader"] = leader
    headers = {"Retry-After": "1"} if retryable else {}
    return web.json_response(body, status=status, headers=headers)


# aiohttp's own refusals (no such route, wrong method, a body over the limit) in that shape.
_HTTP_CAUSES = {404: "no_such_path", 405: "method_not_allowed", 413: "body_too_large"}


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except NotServing as exc:
        return error_response(503, str(exc), exc.cause, True, exc.leader)
    except PodwireError as exc:
        return error_response(_status(exc), str(exc), exc.cause, exc.retryable)
    except web.HTTPRequestEntityTooLarge:
        return error_response(
            413, f"request body is larger than {MAX_BODY} bytes", _HTTP_CAUSES[413]
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        cause = _HTTP_CAUSES.get(exc.status, "bad_request")
        return error_response(exc.status, f"{request.method} {request.path}: {exc.reason}", cause)


class Tokens:
    """Who a bearer token belongs to; comparisons are constant-time, on bytes:
    ``hmac.compare_digest`` raises on a str with non-ASCII characters, which a client chooses."""

    def __init__(self, settings: ControllerSettings) -> None:
        self._admin = settings.admin_token.encode()
        self._nodes = {node: token.encode() for node, token in settings.node_tokens.items()}

    @staticmethod
    def _bearer(request: web.Request) -> bytes:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("missing bearer token")
        if not token.isascii():
            raise Unauthorized(
                "the bearer token has non-ASCII characters: a bearer token is ASCII"
                " (RFC 6750); check the token the client sends (agent.token, the admin's)"
            )
        return token.encode()

    def check_admin(self, request: web.Request) -> None:
        token = self._bearer(request)
        if not self._admin or not hmac.compare_digest(token, self._admin):
            raise Unauthorized("not the admin token")

    def check_node(self, request: web.Request, node: str) -> None:
        token = self._bearer(request)
        owner = next((n for n, t in self._nodes.items() if hmac.compare_digest(token, t)), None)
        if owner is None:
            raise Unauthorized("unknown token")
        if owner != node:
            raise Forbidden(f"this token belongs to node {owner!r}, not {node!r}")


async def _json(request: web.Request) -> Any:
    return doc.decode(await request.read(), "body", MAX_BODY)


def _pool_json(pool: PoolSnapshot) -> dict[str, Any]:
    return {
        "key": pool.key.to_json(),
        "size": pool.size,
        "in_use": pool.in_use,
        "recyclable": pool.recyclable,
        "last_refill": pool.last_refill,
        "waiting": pool.waiting,
        "sizing": pool.target.to_json(),
        "groups": [{"security_groups": list(sgs), "ports": ports} for sgs, ports in pool.groups],
        "unseen": pool.unseen,
    }


class ControllerApi:
    """Every VIF and admin call is served by the serving leader only: elsewhere it is
    refused (503, naming the leader) before it reads or changes anything, and one accepted
    is decided in the term held then (``TermGuard``)."""

    def __init__(
        self,
        service: PoolService,
        broker: VifBroker,
        admin: PoolAdmin,
        settings: ControllerSettings,
        ops: tuple[ReadyCheck, Any],
        term: TermGuard,
        leader: Callable[[], Awaitable[str]],
    ) -> None:
        """``ops``: readiness and the metrics registry; ``leader``: where the leader serves."""
        self.service = service
        self.broker = broker
        self.admin = admin
        self.tokens = Tokens(settings)
        self._term = term
        self._leader = leader
        self.app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY)
        add_ops_routes(self.app, *ops)
        node, admin_only = self._node_call, self._admin_call
        routes = [
            web.post("/v1/nodes/{node}/vifs", node(self.request_vif)),
            web.get("/v1/nodes/{node}/vifs", node(self.list_vifs)),
            web.delete("/v1/nodes/{node}/vifs/{attachment}", node(self.release_vif)),
            web.get("/v1/pools", admin_only(self.list_pools)),
            web.get("/v1/pools/{node}/{project_id}/{network_id}", admin_only(self.show_pool)),
            web.post("/v1/pools/populate", admin_only(self.populate)),
            web.post("/v1/pools/free", admin_only(self.free)),
            web.delete("/v1/nodes/{node}", admin_only(self.remove_node)),
            web.delete("/v1/networks/{network_id}/pools", admin_only(self.delete_network)),
            web.delete("/v1/security-groups/{sg_id}/pools", admin_only(self.remove_sg)),
            web.get("/openapi.json", self.openapi),
        ]
        self.app.add_routes(routes)

    def _node_call(self, handler: NodeHandler) -> Handler:
        async def call(request: web.Request) -> web.StreamResponse:
            node = fields.name(request.match_info["node"], "node")
            self.tokens.check_node(request, node)
            await self._leading()
            return await handler(request, node)

        return call

    def _admin_call(self, handler: Handler) -> Handler:
        async def call(request: web.Request) -> web.StreamResponse:
            self.tokens.check_admin(request)
            await self._leading()
            return await handler(request)

        return call

    async def _leading(self) -> None:
        if not self.service.serving:
            leader = await self._leader()
            where = f"the leader serves at {leader}" if leader else "no leader is known yet"
            raise NotServing(f"this controller is not serving (standby or recovering); {where}",
                             leader)  # fmt: skip
        self._term.join()

    async def request_vif(self, request: web.Request, node: str) -> web.Response:
        body = VifRequest.from_json(await _json(request))
        vif = await self.broker.request(node, body)
        return web.json_response({"vif": vif.to_json()})

    async def release_vif(self, request: web.Request, node: str) -> web.Response:
        attachment = fields.attachment(request.match_info["attachment"], "attachment")
        await self.broker.release(node, attachment)
        return web.Response(status=204)

    async def list_vifs(self, _: web.Request, node: str) -> web.Response:
        vifs = self.service.term.attachments.vifs_of_node(node)
        return web.json_response(
            {
                "attachments": {a: v.to_json() for a, v in vifs.items()},
                "disputed": self.service.term.attachments.disputed_on(node),
            }
        )

    async def list_pools(self, request: web.Request) -> web.Response:
        pools = [_pool_json(self.service.snapshot(key)) for key in self.service.pool_keys()]
        return web.json_response({"pools": pools})

    async def show_pool(self, request: web.Request) -> web.Response:
        info = request.match_info
        key = PoolKey(
            fields.name(info["node"], "node"),
            fields.project_id(info["project_id"], "project_id"),
            fields.neutron_id(info["network_id"], "network_id"),
        )
        if key not in self.service.pool_keys():
            raise UnknownResource(f"no pool {key.to_json()}")
        return web.json_response(_pool_json(self.service.snapshot(key)))

    async def populate(self, request: web.Request) -> web.Response:
        body = doc.closed_object(
            await _json(request),
            "body",
            frozenset({"nodes", "network", "project_id", "security_groups", "count"}),
        )
        nodes = validate.nodes(body.get("nodes"))
        count = validate.count(body.get("count"))
        created = await self.admin.populate(
            nodes,
            fields.neutron_ref(body.get("network"), "network"),
            fields.optional(body.get("project_id"), "project_id", fields.project_id),
            validate.security_group_set(body.get("security_groups")),
            count,
        )
        return web.json_response({"created": created})

    async def free(self, request: web.Request) -> web.Response:
        body = doc.closed_object(await _json(request), "body", frozenset({"nodes"}))
        freed = await self.admin.free_nodes(validate.nodes(body.get("nodes")))
        return web.json_response({"freed": freed})

    async def remove_node(self, request: web.Request) -> web.Response:
        node = fields.name(request.match_info["node"], "node")
        released = await self.broker.remove_node(node, "removed")
        return web.json_response({"node": node, "released": released})

    async def delete_network(self, request: web.Request) -> web.Response:
        network_id = fields.neutron_id(request.match_info["network_id"], "network_id")
        return web.json_response({"freed": await self.admin.delete_network_pools(network_id)})

    async def remove_sg(self, request: web.Request) -> web.Response:
        sg_id = fields.neutron_id(request.match_info["sg_id"], "sg_id")
        network = fields.optional(request.query.get("network_id"), "network_id", fields.neutron_id)
        moved = await self.admin.remove_security_group(sg_id, network)
        return web.json_response({"moved": moved})

    async def openapi(self, _: web.Request) -> web.Response:
        return web.json_response(openapi.document(__version__))
