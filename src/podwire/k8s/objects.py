"""Strict readers for the Namespaces and Pods the watcher consumes.

Only the fields podwire uses are read; each is checked as podwire.schema checks a peer's
value, so an object the API holds but podwire cannot use is refused with a ValidationError
naming the field, and the informer logs and skips it instead of stopping."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from podwire.k8s.port_annotations import KEYS
from podwire.k8s.selectors import read_labels
from podwire.schema import fields
from podwire.schema.doc import as_object

PROTOCOLS = ("TCP", "UDP", "SCTP")
MAX_CONTAINERS = 256
MAX_PORTS = 1024
MAX_FINALIZERS = 64
# Names the Neutron network of a namespace's pods (docs/kubernetes.md).
NETWORK_ANNOTATION = "podwire.io/network"


@dataclass(frozen=True)
class ObjectKey:
    """Where an object lives: namespace ("" for cluster-scoped kinds) and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class Meta:
    key: ObjectKey
    uid: str
    resource_version: str
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class K8sNamespace:
    """``network``: the ``podwire.io/network`` annotation as written (``ns_network`` reads it:
    a bad value refuses the namespace's pods, never the namespace, whose labels policies
    select); ``deleting``: its deletionTimestamp is set."""

    meta: Meta
    network: str | None = None
    deleting: bool = False
    finalizers: tuple[str, ...] = ()


@dataclass(frozen=True)
class NamedPort:
    name: str
    protocol: str
    number: int


@dataclass(frozen=True)
class K8sPod:
    """What a policy needs of a pod: its labels, its addresses and the names of its ports.
    A pod on the host's network or finished holds no address of its own for policies."""

    meta: Meta
    ips: tuple[str, ...]
    named_ports: tuple[NamedPort, ...]
    host_network: bool
    node: str
    # The annotations showing its port (``port_annotations.KEYS``), as the API holds them:
    # what the controller compares before it patches them.
    shown: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def has_own_address(self) -> bool:
        return bool(self.ips) and not self.host_network


def read_meta(value: Any, what: str, *, namespaced: bool) -> Meta:
    body = as_object(value, f"{what}.metadata")
    name = fields.k8s_name(body.get("name"), f"{what}.metadata.name")
    namespace = ""
    if namespaced:
        namespace = fields.k8s_name(body.get("namespace"), f"{what}.metadata.namespace")
    return Meta(
        key=ObjectKey(namespace, name),
        uid=fields.k8s_uid(body.get("uid"), f"{what}.metadata.uid"),
        resource_version=fields.text(
            body.get("resourceVersion"), f"{what}.metadata.resourceVersion", empty=False
        ),
        labels=read_labels(body.get("labels"), f"{what}.metadata.labels"),
    )


def read_namespace(value: Any) -> K8sNamespace:
    body = as_object(value, "namespace")
    meta = read_meta(body.get("metadata"), "namespace", namespaced=False)
    what = f"namespace {meta.key}.metadata"
    raw = as_object(body.get("metadata"), what)
    annotations = as_object(raw.get("annotations") or {}, f"{what}.annotations")
    network = annotations.get(NETWORK_ANNOTATION)
    finalizers = fields.items(raw.get("finalizers") or [], f"{what}.finalizers", MAX_FINALIZERS)
    return K8sNamespace(
        meta,
        network=network if isinstance(network, str) else None,
        deleting=bool(raw.get("deletionTimestamp")),
        finalizers=tuple(fields.text(f, f"{what}.finalizers", 316) for f in finalizers),
    )


def read_pod(value: Any) -> K8sPod:
    body = as_object(value, "pod")
    meta = read_meta(body.get("metadata"), "pod", namespaced=True)
    what = f"pod {meta.key}"
    spec = as_object(body.get("spec") or {}, f"{what}.spec")
    status = as_object(body.get("status") or {}, f"{what}.status")
    return K8sPod(
        meta=meta,
        ips=_pod_ips(status, what),
        named_ports=_named_ports(spec, what),
        host_network=bool(spec.get("hostNetwork", False) is True),
        node=fields.text(spec.get("nodeName") or "", f"{what}.spec.nodeName"),
        shown=_shown(body.get("metadata"), what),
    )


def _shown(metadata: Any, what: str) -> dict[str, str]:
    annotations = as_object(as_object(metadata, what).get("annotations") or {}, what)
    return {key: value for key in KEYS if isinstance(value := annotations.get(key), str)}


def _pod_ips(status: dict[str, Any], what: str) -> tuple[str, ...]:
    """A finished pod's addresses may already be another pod's: it has none for policies."""
    if status.get("phase") in ("Succeeded", "Failed"):
        return ()
    entries = fields.items(status.get("podIPs") or [], f"{what}.status.podIPs", 16)
    ips = {
        str(fields.ip_address(as_object(e, f"{what}.status.podIPs").get("ip"), f"{what}.podIP"))
        for e in entries
    }
    return tuple(sorted(ips))


def _named_ports(spec: dict[str, Any], what: str) -> tuple[NamedPort, ...]:
    found: set[NamedPort] = set()
    containers = fields.items(spec.get("containers") or [], f"{what}.containers", MAX_CONTAINERS)
    for index, container in enumerate(containers):
        where = f"{what}.containers[{index}]"
        ports = fields.items(as_object(container, where).get("ports") or [], where, MAX_PORTS)
        for port in ports:
            body = as_object(port, f"{where}.ports")
            if body.get("name") is None:
                continue
            found.add(_named_port(body, f"{where}.ports"))
    return tuple(sorted(found, key=lambda p: (p.name, p.protocol, p.number)))


def _named_port(body: dict[str, Any], what: str) -> NamedPort:
    return NamedPort(
        name=fields.text(body.get("name"), f"{what}.name", 15, empty=False),
        protocol=fields.one_of(body.get("protocol", "TCP"), f"{what}.protocol", PROTOCOLS),
        number=fields.integer(body.get("containerPort"), f"{what}.containerPort", 1, 65535),
    )
