"""The wire contract with kubelet: names and numbers as upstream, stubs current with protos."""

from __future__ import annotations

import pytest

from podwire.deviceplugin.api import dp, pr

# (message, field, number) copied from the published kubelet API, not from our .proto files.
DEVICEPLUGIN_FIELDS = [
    ("RegisterRequest", "version", 1),
    ("RegisterRequest", "endpoint", 2),
    ("RegisterRequest", "resource_name", 3),
    ("RegisterRequest", "options", 4),
    ("DevicePluginOptions", "pre_start_required", 1),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2),
    ("Device", "ID", 1),
    ("Device", "health", 2),
    ("Device", "topology", 3),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1),
    ("ContainerAllocateRequest", "devices_ids", 1),
    ("ContainerAllocateResponse", "envs", 1),
    ("ContainerAllocateResponse", "mounts", 2),
    ("ContainerAllocateResponse", "devices", 3),
    ("ContainerAllocateResponse", "annotations", 4),
    ("ContainerAllocateResponse", "cdi_devices", 5),
    ("Mount", "container_path", 1),
    ("Mount", "host_path", 2),
    ("Mount", "read_only", 3),
    ("PreStartContainerRequest", "devices_ids", 1),
]
PODRESOURCES_FIELDS = [
    ("ListPodResourcesResponse", "pod_resources", 1),
    ("PodResources", "name", 1),
    ("PodResources", "namespace", 2),
    ("PodResources", "containers", 3),
    ("ContainerResources", "devices", 2),
    ("ContainerResources", "dynamic_resources", 5),
    ("ContainerDevices", "resource_name", 1),
    ("ContainerDevices", "device_ids", 2),
    ("GetPodResourcesRequest", "pod_name", 1),
    ("GetPodResourcesRequest", "pod_namespace", 2),
    ("ClaimResource", "share_id", 5),
]


@pytest.mark.parametrize(
    ("module", "fields"), [(dp, DEVICEPLUGIN_FIELDS), (pr, PODRESOURCES_FIELDS)]
)
def test_field_names_and_numbers_match_kubelet(
    module: object, fields: list[tuple[str, str, int]]
) -> None:
    descriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    for message, field, number in fields:
        assert descriptor.message_types_by_name[message].fields_by_name[field].number == number


def test_service_method_paths_match_kubelet() -> None:
    def methods(module: object, service: str) -> set[str]:
        found = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
        return {f"/{found.full_name}/{m.name}" for m in found.methods}

    assert methods(dp, "Registration") == {"/v1beta1.Registration/Register"}
    assert methods(dp, "DevicePlugin") == {
        f"/v1beta1.DevicePlugin/{name}"
        for name in (
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        )
    }
    assert methods(pr, "PodResourcesLister") == {
        "/v1.PodResourcesLister/List",
        "/v1.PodResourcesLister/GetAllocatableResources",
        "/v1.PodResourcesLister/Get",
    }


def test_committed_stubs_are_generated_from_the_protos() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) regenerates the stubs")
    from podwire.deviceplugin import genprotos

    assert genprotos.main(["--check"]) == 0
