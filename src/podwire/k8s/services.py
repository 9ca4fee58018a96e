"""Services and EndpointSlices as podwire reads them, and what a Service compiles to.

The readers keep what a pod needs to reach a ClusterIP Service: its IPv4 ClusterIPs and
ports, its session affinity, and of its EndpointSlices the ready IPv4 endpoints with their
pods and port numbers (the slice already resolved named target ports, per pod). Headless
Services, ExternalName and Services without a ClusterIP compile to nothing.

A backend's network comes from its pod's ``podwire.io/network`` annotation, which the
controller writes once the pod has its port: a backend whose network is not known yet is
left out until it is (the pod's event recompiles the Service), never guessed, since on
overlapping tenant networks the same address on another network is another pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podwire.k8s.objects import K8sPod, Meta, ObjectKey, read_meta
from podwire.k8s.port_annotations import NETWORK
from podwire.schema import fields
from podwire.schema.doc import as_object
from podwire.schema.services import (
    HOST_NETWORK,
    Backend,
    ServiceEntry,
    ServicePort,
    sorted_backends,
)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MAX_PORTS = 256
MAX_ENDPOINTS = 1000  # the API's limit per EndpointSlice
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}


@dataclass(frozen=True)
class K8sServicePort:
    name: str
    protocol: str  # tcp, udp, sctp
    port: int


@dataclass(frozen=True)
class K8sService:
    meta: Meta
    ips: tuple[str, ...]  # IPv4 ClusterIPs; empty: headless or ExternalName
    ports: tuple[K8sServicePort, ...]
    affinity: bool


@dataclass(frozen=True)
class SliceEndpoint:
    address: str
    ready: bool
    pod: ObjectKey | None  # targetRef when it names a Pod


@dataclass(frozen=True)
class EndpointSlice:
    meta: Meta
    service: ObjectKey | None  # from the kubernetes.io/service-name label
    endpoints: tuple[SliceEndpoint, ...]
    ports: tuple[K8sServicePort, ...]  # name "" for a Service's single unnamed port


def read_service(value: Any) -> K8sService:
    body = as_object(value, "service")
    meta = read_meta(body.get("metadata"), "service", namespaced=True)
    what = f"service {meta.key}.spec"
    spec = as_object(body.get("spec") or {}, what)
    raw_ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    ips = []
    for raw in fields.items(raw_ips, f"{what}.clusterIPs", 2):
        if raw == "None":  # headless
            return K8sService(meta, (), (), False)
        address = fields.ip_address(raw, f"{what}.clusterIPs")
        if address.version == 4:
            ips.append(str(address))
    ports = fields.items(spec.get("ports") or [], f"{what}.ports", MAX_PORTS)
    return K8sService(
        meta,
        tuple(ips) if spec.get("type", "ClusterIP") != "ExternalName" else (),
        tuple(_port(p, f"{what}.ports[{i}]", "port") for i, p in enumerate(ports)),
        spec.get("sessionAffinity") == "ClientIP",
    )


def read_endpoint_slice(value: Any) -> EndpointSlice:
    body = as_object(value, "endpointslice")
    meta = read_meta(body.get("metadata"), "endpointslice", namespaced=True)
    what = f"endpointslice {meta.key}"
    owner = meta.labels.get(SERVICE_NAME_LABEL)
    service = ObjectKey(meta.key.namespace, owner) if owner else None
    if body.get("addressType") != "IPv4":
        return EndpointSlice(meta, service, (), ())
    endpoints = fields.items(body.get("endpoints") or [], f"{what}.endpoints", MAX_ENDPOINTS)
    ports = fields.items(body.get("ports") or [], f"{what}.ports", MAX_PORTS)
    return EndpointSlice(
        meta,
        service,
        tuple(e for i, raw in enumerate(endpoints) for e in _endpoints(raw, f"{what}[{i}]")),
        tuple(_port(p, f"{what}.ports[{i}]", "port") for i, p in enumerate(ports)),
    )


def _port(value: Any, what: str, number_key: str) -> K8sServicePort:
    body = as_object(value, what)
    protocol = fields.one_of(body.get("protocol", "TCP"), f"{what}.protocol", tuple(PROTOCOLS))
    return K8sServicePort(
        name=fields.text(body.get("name") or "", f"{what}.name", 63),
        protocol=PROTOCOLS[protocol],
        port=fields.integer(body.get(number_key), f"{what}.{number_key}", 1, 65535),
    )


def _endpoints(value: Any, what: str) -> list[SliceEndpoint]:
    body = as_object(value, what)
    conditions = as_object(body.get("conditions") or {}, f"{what}.conditions")
    ready = conditions.get("ready") is not False  # nil means ready (the API's rule)
    ref = as_object(body.get("targetRef") or {}, f"{what}.targetRef")
    pod = None
    if ref.get("kind") == "Pod":
        namespace = fields.k8s_name(ref.get("namespace"), f"{what}.targetRef.namespace")
        pod = ObjectKey(namespace, fields.k8s_name(ref.get("name"), f"{what}.targetRef.name"))
    addresses = fields.items(body.get("addresses") or [], f"{what}.addresses", 100)
    return [
        SliceEndpoint(str(fields.ip_address(a, f"{what}.addresses", 4)), ready, pod)
        for a in addresses
    ]


def compile_service(
    service: K8sService, slices: list[EndpointSlice], pods: Mapping[ObjectKey, K8sPod]
) -> ServiceEntry | None:
    """The published form of one Service; None for one that pods do not reach by a
    ClusterIP (headless, ExternalName, no ports)."""
    if not service.ips or not service.ports:
        return None
    ports = []
    for port in service.ports:
        backends = [backend for piece in slices for backend in _backends(piece, port, pods)]
        ports.append(ServicePort(port.protocol, port.port, sorted_backends(backends)))
    return ServiceEntry(str(service.meta.key), service.ips, service.affinity, tuple(ports))


def _backends(
    piece: EndpointSlice, port: K8sServicePort, pods: Mapping[ObjectKey, K8sPod]
) -> list[Backend]:
    """A slice port answers a Service port of the same name and protocol."""
    numbers = [p.port for p in piece.ports if p.name == port.name and p.protocol == port.protocol]
    if not numbers:
        return []
    found = []
    for endpoint in piece.endpoints:
        network = _network(endpoint, pods)
        if endpoint.ready and network is not None:
            found.append(Backend(endpoint.address, numbers[0], network))
    return found


def _network(endpoint: SliceEndpoint, pods: Mapping[ObjectKey, K8sPod]) -> str | None:
    if endpoint.pod is None:
        return HOST_NETWORK  # the apiserver's own endpoints, or someone's manual slice
    pod = pods.get(endpoint.pod)
    if pod is None:
        return None
    if pod.host_network:
        return HOST_NETWORK
    return pod.shown.get(NETWORK)
