"""Translation of gRPC failures from etcd into podwire's exception hierarchy."""

from __future__ import annotations

import grpc

from podwire.errors import ConfigError, EtcdUnavailable, PermanentError, PodwireError
from podwire.grpc_status import TRANSIENT

# etcd also answers ABORTED and UNKNOWN while its members elect a leader.
_RETRYABLE = TRANSIENT | {grpc.StatusCode.ABORTED, grpc.StatusCode.UNKNOWN}

# What etcd says when a token it issued is no longer valid: a restarted member forgot its
# simple tokens, the token's TTL ran out, or the user's password changed since.
_STALE_TOKEN = ("invalid auth token", "revision of auth store is old")


class EtcdPermissionDenied(PermanentError):
    """The etcd user's role does not cover the key; the message names key and user."""


def token_rejected(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a fresh token could make this call succeed."""
    detail = exc.details() or ""
    return exc.code() == grpc.StatusCode.UNAUTHENTICATED or any(s in detail for s in _STALE_TOKEN)


def denied(what: str, user: str) -> EtcdPermissionDenied:
    who = f"etcd user {user!r}" if user else "this client (no etcd user configured)"
    return EtcdPermissionDenied(
        f"etcd {what}: permission denied for {who}: its role does not cover this key"
    )


def translate(exc: grpc.aio.AioRpcError, what: str, user: str = "") -> PodwireError:
    """Map an etcd gRPC error to a retryable or permanent podwire error naming the operation."""
    code = exc.code()
    detail = exc.details() or code.name
    if code in _RETRYABLE or "leader changed" in detail or "no leader" in detail:
        return EtcdUnavailable(f"etcd {what}: {detail}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return denied(what, user)
    if "user name is empty" in detail:
        return ConfigError(
            f"etcd {what}: this etcd cluster requires authentication; set etcd.user and"
            " etcd.password"
        )
    return PermanentError(f"etcd {what}: {code.name}: {detail}")


def authentication_error(exc: grpc.aio.AioRpcError, user: str) -> PodwireError:
    """The Authenticate call's own failures: bad credentials are a configuration problem."""
    detail = exc.details() or exc.code().name
    if "authentication failed" in detail:
        return ConfigError(
            f"etcd refused user {user!r}: wrong user name or password (etcd.user/etcd.password)"
        )
    if "authentication is not enabled" in detail:
        return ConfigError(
            f"etcd.user is {user!r} but this etcd cluster has authentication disabled"
        )
    return translate(exc, f"authenticate as {user!r}", user)
