"""Services and EndpointSlices read strictly and compiled to what agents translate: only ready
endpoints, named ports matched by name, each backend with its pod's network, nothing for a
pod whose network is not known yet; the published value read back equal."""

from __future__ import annotations

from typing import Any

import pytest

from podwire.errors import ValidationError
from podwire.k8s.objects import ObjectKey, read_pod
from podwire.k8s.port_annotations import NETWORK
from podwire.k8s.services import compile_service, read_endpoint_slice, read_service
from podwire.schema import doc
from podwire.schema.services import HOST_NETWORK, read_service_entry
from tests.k8s.objects import meta

NET = "9b2a3c5e-1111-4222-8333-444455556666"


def _service(**spec: Any) -> Any:
    body = {
        "clusterIP": "10.96.0.20",
        "clusterIPs": ["10.96.0.20"],
        "ports": [
            {"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"},
            {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353},
        ],
    }
    return read_service({"metadata": meta("web", "shop"), "spec": body | spec})


def _slice(endpoints: list[dict[str, Any]], ports: list[dict[str, Any]] | None = None) -> Any:
    labels = {"kubernetes.io/service-name": "web"}
    return read_endpoint_slice(
        {
            "metadata": meta("web-abcde", "shop", labels),
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": ports
            if ports is not None
            else [
                {"name": "http", "protocol": "TCP", "port": 8080},
                {"name": "dns", "protocol": "UDP", "port": 5353},
            ],
        }
    )


def _endpoint(address: str, pod: str | None, ready: bool | None = True) -> dict[str, Any]:
    body: dict[str, Any] = {"addresses": [address], "conditions": {"ready": ready}}
    if pod is not None:
        body["targetRef"] = {"kind": "Pod", "namespace": "shop", "name": pod}
    return body


def _pods(**networks: str | None) -> dict[ObjectKey, Any]:
    pods = {}
    for name, network in networks.items():
        annotations = {NETWORK: network} if network else {}
        body = meta(name, "shop")
        body["annotations"] = annotations
        pods[ObjectKey("shop", name)] = read_pod({"metadata": body, "spec": {}, "status": {}})
    return pods


def test_ready_endpoints_with_their_networks() -> None:
    endpoints = [
        _endpoint("10.0.0.5", "a"),
        _endpoint("10.0.0.6", "b", ready=False),
        _endpoint("10.0.0.7", "c", ready=None),  # nil means ready
        _endpoint("10.0.0.8", "d"),  # its network not known yet: left out
        _endpoint("192.0.2.2", None),  # no pod: outside every network
    ]
    entry = compile_service(_service(), [_slice(endpoints)], _pods(a=NET, b=NET, c=NET, d=None))
    assert entry is not None
    http, dns = entry.ports
    assert (http.protocol, http.port, dns.protocol, dns.port) == ("tcp", 80, "udp", 53)
    assert [(b.address, b.port, b.network) for b in http.backends] == [
        ("10.0.0.5", 8080, NET),
        ("10.0.0.7", 8080, NET),
        ("192.0.2.2", 8080, HOST_NETWORK),
    ]
    assert [b.port for b in dns.backends] == [5353, 5353, 5353]
    assert read_service_entry(entry.encode(), "value") == entry


def test_a_slice_port_serves_only_the_service_port_of_its_name() -> None:
    ports = [{"name": "http", "protocol": "TCP", "port": 8080}]
    entry = compile_service(_service(), [_slice([_endpoint("10.0.0.5", "a")], ports)], _pods(a=NET))
    assert entry is not None
    assert [len(port.backends) for port in entry.ports] == [1, 0]


@pytest.mark.parametrize(
    "spec",
    [{"clusterIP": "None", "clusterIPs": ["None"]}, {"type": "ExternalName"}, {"ports": []}],
)
def test_services_pods_do_not_reach_by_a_cluster_ip_compile_to_nothing(spec: Any) -> None:
    assert compile_service(_service(**spec), [], {}) is None


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"service": "a/b", "ips": ["10.96.0.1"], "ports": "x"}, "ports"),
        ({"service": "a/b", "ips": ["224.0.0.1"], "ports": []}, "ips"),
        (
            {"service": "a/b", "ips": ["10.96.0.1"],
             "ports": [{"protocol": "icmp", "port": 1, "backends": []}]},
            "protocol",
        ),
        (
            {"service": "a/b", "ips": ["10.96.0.1"],
             "ports": [{"protocol": "tcp", "port": 80,
                        "backends": [{"address": "10.0.0.5", "port": 0, "network": NET}]}]},
            "port",
        ),
        (
            {"service": "a/b", "ips": ["10.96.0.1"],
             "ports": [{"protocol": "tcp", "port": 80,
                        "backends": [{"address": "10.0.0.5", "port": 80, "network": "x y"}]}]},
            "network",
        ),
        (
            {"service": "a/b", "ips": ["10.96.0.1"],
             "ports": [{"protocol": "tcp", "port": 80, "backends": []},
                       {"protocol": "tcp", "port": 80, "backends": []}]},
            "twice",
        ),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_naming_the_field(value: Any, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        read_service_entry(doc.encode_versioned(value), "/podwire/services/a/b")


def test_a_slice_with_a_bad_endpoint_is_refused() -> None:
    with pytest.raises(ValidationError, match="addresses"):
        _slice([{"addresses": ["not-an-address"]}])
