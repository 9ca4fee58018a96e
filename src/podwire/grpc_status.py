"""The gRPC status codes after which the same call may succeed later (a peer restarting, a
deadline under load, a stream cut): one set for every gRPC peer podwire calls."""

from __future__ import annotations

import grpc

TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
