"""A Kubernetes Service as the controller publishes it and agents translate it in pods.

One value per Service, ``/podwire/services/<namespace>/<name>``, written only by the leader
controller from the API's Service and EndpointSlices, read by every agent
(docs/architecture.md §3b). It holds what a pod's own namespace needs to translate a
connection to the Service: the ClusterIPs, and per port the ready backends with the Neutron
network each is on, so an agent gives a pod only the backends of its own network (tenant
networks may overlap: the same address on another network is another pod).

The value is whole per Service: an endpoint change rewrites one value, whatever the number
of Services, and an agent changes only that Service's chains in its pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podwire.schema import doc, fields

PROTOCOLS = ("tcp", "udp", "sctp")
MAX_IPS = 2  # a dual-stack Service has one of each family
MAX_PORTS = 256
MAX_BACKENDS = 2000
HOST_NETWORK = "host"  # a backend outside every Neutron network (hostNetwork pods, apiserver)


@dataclass(frozen=True)
class Backend:
    address: str
    port: int
    network: str  # a Neutron network id, or HOST_NETWORK

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "port": self.port, "network": self.network}


@dataclass(frozen=True)
class ServicePort:
    protocol: str  # one of PROTOCOLS
    port: int
    backends: tuple[Backend, ...]  # ready ones only, sorted: equal sets encode equal

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "port": self.port,
            "backends": [backend.to_json() for backend in self.backends],
        }


@dataclass(frozen=True)
class ServiceEntry:
    service: str  # "<namespace>/<name>", for logs and status
    ips: tuple[str, ...]
    affinity: bool  # sessionAffinity ClientIP: one client, one backend
    ports: tuple[ServicePort, ...]

    def encode(self) -> bytes:
        return doc.encode_versioned(
            {
                "service": self.service,
                "ips": list(self.ips),
                "affinity": self.affinity,
                "ports": [port.to_json() for port in self.ports],
            }
        )


def read_service_entry(raw: bytes, what: str) -> ServiceEntry:
    """The strict reader of the value; ValidationError names the field."""
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    ports = obj.req("ports", lambda v, w: fields.each(v, w, _port, MAX_PORTS))
    keys = [(port.protocol, port.port) for port in ports]
    if len(set(keys)) != len(keys):
        raise fields.fail(obj.field("ports"), "a protocol and port listed twice")
    return ServiceEntry(
        service=obj.req("service", lambda v, w: fields.text(v, w, 254, empty=False)),
        ips=tuple(obj.req("ips", lambda v, w: fields.each(v, w, _ipv4, MAX_IPS))),
        affinity=obj.opt("affinity", fields.boolean, False),
        ports=tuple(ports),
    )


def _ipv4(value: Any, what: str) -> str:
    return str(fields.host_address(value, what, version=4))


def _port_number(value: Any, what: str) -> int:
    return fields.integer(value, what, 1, 65535)


def _port(value: Any, what: str) -> ServicePort:
    obj = doc.Obj(doc.as_object(value, what), what)
    backends = obj.req("backends", lambda v, w: fields.each(v, w, _backend, MAX_BACKENDS))
    return ServicePort(
        protocol=obj.req("protocol", lambda v, w: fields.one_of(v, w, PROTOCOLS)),
        port=obj.req("port", _port_number),
        backends=sorted_backends(backends),
    )


def _backend(value: Any, what: str) -> Backend:
    obj = doc.Obj(doc.as_object(value, what), what)
    network = obj.req("network", lambda v, w: fields.text(v, w, 64, empty=False))
    if network != HOST_NETWORK:
        network = fields.neutron_id(network, obj.field("network"))
    return Backend(
        address=obj.req("address", _ipv4), port=obj.req("port", _port_number), network=network
    )


def _order(backend: Backend) -> tuple[str, int, str]:
    return (backend.address, backend.port, backend.network)


def sorted_backends(backends: list[Backend]) -> tuple[Backend, ...]:
    """The canonical order the reader gives: the writer uses it too, so a value re-encoded
    from what was read is byte-equal and no rewrite is sent."""
    return tuple(sorted(set(backends), key=_order))
