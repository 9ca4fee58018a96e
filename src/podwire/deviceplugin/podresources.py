"""Kubelet's PodResources API: which running pod holds which of our devices.

A fresh channel per call: calls are rare (reconcile, pod deletion) and kubelet restarts
replace the socket, which a long-lived channel would only notice through its own backoff.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from podwire.deviceplugin.api import pod_resources_stub, pr
from podwire.deviceplugin.model import PodName, valid_pod_name
from podwire.errors import PermanentError, RetryableError
from podwire.grpc_status import TRANSIENT
from podwire.log import get_logger

log = get_logger(__name__)

_MAX_MESSAGE = 16 * 1024 * 1024


class PodResourcesUnavailable(RetryableError):
    """Kubelet's PodResources socket is absent or failing; nothing can be concluded."""


class PodResourcesNotSynced(PodResourcesUnavailable):
    """Kubelet listed no pod at all while grants are held: a kubelet that has just started
    lists nothing until it has its pods from the apiserver (about 1 s after a restart here; as
    long as the apiserver is unreachable), so the list proves no pod gone."""


class PodResourcesError(PermanentError):
    """Kubelet answered the call with an error (unknown pod, method disabled, ...)."""


class PodResourcesClient:
    def __init__(self, socket_path: str, *, timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    async def assignments(self, resource_name: str, *, holding: int = 0) -> dict[str, PodName]:
        """Device id -> pod, for every running pod kubelet reports. ``holding``: how many
        grants the caller holds; if any, a list without a single pod raises
        ``PodResourcesNotSynced`` instead of saying that none of them is assigned."""
        response = await self._call("List", pr.ListPodResourcesRequest())
        if not isinstance(response, pr.ListPodResourcesResponse):
            raise PodResourcesError(f"kubelet List answered with {type(response).__name__}")
        if holding and not response.pod_resources:
            raise PodResourcesNotSynced(
                f"kubelet pod resources List at {self.socket_path}: no pod at all (a kubelet"
                " that has just started, or cannot reach the apiserver, has not learned its pods"
                f" yet); the {holding} grants are kept until it lists pods"
            )
        assigned: dict[str, PodName] = {}
        for pod in response.pod_resources:
            ref = _pod_name(pod)
            if ref is None:
                continue
            for device in _devices(pod, resource_name):
                assigned[device] = ref
        return assigned

    async def pod_devices(self, pod: PodName, resource_name: str) -> list[str]:
        """Our devices held by one pod; uses ``Get`` and falls back to ``List`` where kubelet
        does not offer ``Get`` (older kubelets, or its feature gate off)."""
        request = pr.GetPodResourcesRequest(pod_name=pod.name, pod_namespace=pod.namespace)
        try:
            response = await self._call("Get", request)
        except PodResourcesError as exc:
            log.debug("deviceplugin.podresources.get_failed", pod=str(pod), error=str(exc))
            assigned = await self.assignments(resource_name)
            return sorted(d for d, owner in assigned.items() if owner == pod)
        if not isinstance(response, pr.GetPodResourcesResponse):
            raise PodResourcesError(f"kubelet Get answered with {type(response).__name__}")
        if _pod_name(response.pod_resources) != pod:
            return []
        return sorted(_devices(response.pod_resources, resource_name))

    async def _call(self, method: str, request: object) -> object:
        if not self.socket_path.startswith("/"):
            raise PodResourcesUnavailable(
                f"pod resources socket {self.socket_path} is not absolute"
            )
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE)]
        target = f"unix://{self.socket_path}"
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            stub = pod_resources_stub(channel)
            try:
                response: object = await getattr(stub, method)(request, timeout=self.timeout)
            except grpc.aio.AioRpcError as exc:
                message = (
                    f"kubelet pod resources {method} at {self.socket_path}:"
                    f" {exc.code().name}: {exc.details()}"
                )
                if exc.code() in TRANSIENT:
                    raise PodResourcesUnavailable(message) from exc
                raise PodResourcesError(message) from exc
        return response


def _pod_name(pod: pr.PodResources) -> PodName | None:
    if not (valid_pod_name(pod.namespace) and valid_pod_name(pod.name)):
        log.warning("deviceplugin.podresources.bad_pod", namespace=pod.namespace, name=pod.name)
        return None
    return PodName(pod.namespace, pod.name)


def _devices(pod: pr.PodResources, resource_name: str) -> Iterable[str]:
    for container in pod.containers:
        for group in container.devices:
            if group.resource_name == resource_name:
                yield from group.device_ids
