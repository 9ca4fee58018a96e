"""Translation of gRPC failures from etcd into podwire's exception hierarchy."""

from __future__ import annotations

import grpc

from podwire.errors import EtcdUnavailable, PermanentError, PodwireError

_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNKNOWN,
}


def translate(exc: grpc.aio.AioRpcError, what: str) -> PodwireError:
    """Map an etcd gRPC error to a retryable or permanent podwire error naming the operation."""
    code = exc.code()
    detail = exc.details() or code.name
    if code in _RETRYABLE or "leader changed" in detail or "no leader" in detail:
        return EtcdUnavailable(f"etcd {what}: {detail}")
    return PermanentError(f"etcd {what}: {code.name}: {detail}")
