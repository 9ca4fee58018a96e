"""Telling kubelet where our DevicePlugin service listens (the Registration service)."""

from __future__ import annotations

from pathlib import Path

import grpc

from podwire.deviceplugin.api import API_VERSION, dp, registration_stub
from podwire.errors import PermanentError, RetryableError
from podwire.grpc_status import TRANSIENT


class KubeletUnavailable(RetryableError):
    """Kubelet's registration socket is absent or does not answer (yet)."""


class RegistrationRejected(PermanentError):
    """Kubelet answered and said no (API version or resource name); retrying will not help."""


def options() -> dp.DevicePluginOptions:
    return dp.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


async def register(
    kubelet_socket: Path, endpoint: str, resource_name: str, *, rpc_timeout: float
) -> None:
    """``endpoint`` is our socket's file name: kubelet resolves it in its own plugin dir."""
    if not _exists(kubelet_socket):
        raise KubeletUnavailable(f"kubelet socket {kubelet_socket} does not exist yet")
    request = dp.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=options(),
    )
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        try:
            await registration_stub(channel).Register(request, timeout=rpc_timeout)
        except grpc.aio.AioRpcError as exc:
            message = f"kubelet at {kubelet_socket}: {exc.code().name}: {exc.details()}"
            if exc.code() in TRANSIENT:
                raise KubeletUnavailable(message) from exc
            raise RegistrationRejected(
                f"registration of {resource_name} refused by {message}"
            ) from exc


def _exists(path: Path) -> bool:
    return path.exists()
