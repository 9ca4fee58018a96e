"""The CRI stubs speak the published k8s.io/cri-api v1 wire contract (names and numbers)."""

from __future__ import annotations

import pytest

from podwire.kube.cri.generated import cri_runtime_v1_pb2 as pb

# (message, field, number) as in the published api.proto, not read from our .proto file.
FIELDS = [
    ("PodSandboxMetadata", "name", 1),
    ("PodSandboxMetadata", "uid", 2),
    ("PodSandboxMetadata", "namespace", 3),
    ("PodSandboxMetadata", "attempt", 4),
    ("PodSandboxConfig", "metadata", 1),
    ("PodSandboxConfig", "hostname", 2),
    ("PodSandboxConfig", "port_mappings", 5),
    ("PodSandboxConfig", "linux", 8),
    ("PortMapping", "protocol", 1),
    ("PortMapping", "container_port", 2),
    ("PortMapping", "host_port", 3),
    ("LinuxPodSandboxConfig", "security_context", 2),
    ("LinuxSandboxSecurityContext", "namespace_options", 1),
    ("NamespaceOption", "network", 1),
    ("RunPodSandboxRequest", "config", 1),
    ("RunPodSandboxRequest", "runtime_handler", 2),
    ("RunPodSandboxResponse", "pod_sandbox_id", 1),
    ("PodSandboxStatusRequest", "verbose", 2),
    ("PodSandboxStatus", "state", 3),
    ("PodSandboxStatus", "network", 5),
    ("PodSandboxNetworkStatus", "ip", 1),
    ("PodSandboxNetworkStatus", "additional_ips", 2),
    ("PodSandboxStatusResponse", "info", 2),
    ("ListPodSandboxResponse", "items", 1),
    ("StatusResponse", "status", 1),
    ("StatusResponse", "info", 2),
    ("RuntimeCondition", "type", 1),
    ("RuntimeCondition", "status", 2),
]


@pytest.mark.parametrize(("message", "field", "number"), FIELDS)
def test_field_numbers_match_the_published_api(message: str, field: str, number: int) -> None:
    assert pb.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].number == number


def test_method_paths_match_the_published_api() -> None:
    service = pb.DESCRIPTOR.services_by_name["RuntimeService"]
    assert service.full_name == "runtime.v1.RuntimeService"
    assert {m.name for m in service.methods} == {
        "Version",
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "PodSandboxStatus",
        "ListPodSandbox",
        "Status",
    }
    assert pb.SANDBOX_READY == 0 and pb.POD == 0 and pb.TCP == 0


def test_the_committed_stubs_are_generated_from_the_proto() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) regenerates the stubs")
    from podwire.deviceplugin import genprotos

    assert genprotos.main(["--check", "--only", "cri"]) == 0
