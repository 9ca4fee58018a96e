"""Controller errors; the API maps each to one HTTP status."""

from __future__ import annotations

from podwire.errors import PermanentError, RetryableError


class PoolNotReady(RetryableError):
    """No port could be handed out now (pool empty, refill failed or still running)."""


class NotServing(RetryableError):
    """This controller is not the leader or has not finished recovery."""


class UnknownResource(PermanentError):
    """A network, project or security group the request names does not exist (HTTP 404)."""


class Forbidden(PermanentError):
    """The caller's token does not allow this (HTTP 403)."""


class Unauthorized(PermanentError):
    """No token or an unknown token (HTTP 401)."""


class NodeNotAlive(PermanentError):
    """The node has no live agent, so ports for it could not bind (HTTP 409)."""
