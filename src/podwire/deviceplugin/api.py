"""The kubelet API surface podwire uses, in one place: constants plus typed access to stubs.

The grpcio-tools service stubs are untyped; everything else in the package reaches them only
through here so ``mypy --strict`` sees typed code everywhere but this seam.
"""

from __future__ import annotations

from typing import Any

from podwire.deviceplugin.generated import (
    deviceplugin_v1beta1_pb2 as dp,
)
from podwire.deviceplugin.generated import (
    deviceplugin_v1beta1_pb2_grpc as _dp_grpc,
)
from podwire.deviceplugin.generated import (
    podresources_v1_pb2 as pr,
)
from podwire.deviceplugin.generated import (
    podresources_v1_pb2_grpc as _pr_grpc,
)

__all__ = [
    "API_VERSION",
    "HEALTHY",
    "KUBELET_SOCKET",
    "UNHEALTHY",
    "DevicePluginServicerBase",
    "PodResourcesListerServicerBase",
    "RegistrationServicerBase",
    "add_device_plugin_servicer",
    "add_pod_resources_servicer",
    "add_registration_servicer",
    "device_plugin_stub",
    "dp",
    "pod_resources_stub",
    "pr",
    "registration_stub",
]

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Kubelet's registration socket, always this name inside the device-plugins dir.
KUBELET_SOCKET = "kubelet.sock"
# Kubelet rejects longer device IDs.
MAX_DEVICE_ID_LEN = 63

_dp_any: Any = _dp_grpc
_pr_any: Any = _pr_grpc

DevicePluginServicerBase = _dp_grpc.DevicePluginServicer
RegistrationServicerBase = _dp_grpc.RegistrationServicer
PodResourcesListerServicerBase = _pr_grpc.PodResourcesListerServicer


def add_device_plugin_servicer(servicer: object, server: Any) -> None:
    _dp_any.add_DevicePluginServicer_to_server(servicer, server)


def add_registration_servicer(servicer: object, server: Any) -> None:
    _dp_any.add_RegistrationServicer_to_server(servicer, server)


def add_pod_resources_servicer(servicer: object, server: Any) -> None:
    _pr_any.add_PodResourcesListerServicer_to_server(servicer, server)


def registration_stub(channel: Any) -> Any:
    return _dp_any.RegistrationStub(channel)


def device_plugin_stub(channel: Any) -> Any:
    return _dp_any.DevicePluginStub(channel)


def pod_resources_stub(channel: Any) -> Any:
    return _pr_any.PodResourcesListerStub(channel)
