"""Builders of API objects (as the apiserver sends them) for the k8s unit tests."""

from __future__ import annotations

import itertools
from typing import Any

from podwire.k8s.compile import Cluster
from podwire.k8s.netpol import NetworkPolicy, read_network_policy
from podwire.k8s.objects import K8sNamespace, K8sPod, ObjectKey, read_namespace, read_pod

_uids = itertools.count(1)


def meta(name: str, namespace: str | None = None, labels: dict[str, str] | None = None) -> Any:
    body: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{next(_uids)}",
        "resourceVersion": "1",
        "labels": labels or {},
    }
    if namespace is not None:
        body["namespace"] = namespace
    return body


def namespace(name: str, **labels: str) -> K8sNamespace:
    return read_namespace({"metadata": meta(name, None, labels)})


def pod(
    namespace: str,
    name: str,
    ips: list[str],
    labels: dict[str, str] | None = None,
    ports: list[dict[str, Any]] | None = None,
    host_network: bool = False,
) -> K8sPod:
    return read_pod(
        {
            "metadata": meta(name, namespace, labels),
            "spec": {
                "nodeName": "node-1",
                "hostNetwork": host_network,
                "containers": [{"name": "c", "ports": ports or []}],
            },
            "status": {"phase": "Running", "podIPs": [{"ip": ip} for ip in ips]},
        }
    )


def namespace_manifest(name: str) -> dict[str, Any]:
    """A Namespace as kubectl applies it."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def policy_manifest(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A NetworkPolicy as kubectl applies it."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def policy(namespace: str, name: str, spec: dict[str, Any]) -> NetworkPolicy:
    return read_network_policy({"metadata": meta(name, namespace), "spec": spec})


def cluster(
    namespaces: list[K8sNamespace], pods: list[K8sPod], policies: list[NetworkPolicy]
) -> Cluster:
    return Cluster(
        namespaces={n.meta.key: n for n in namespaces},
        pods={p.meta.key: p for p in pods},
        policies={p.meta.key: p for p in policies},
    )


def key(namespace: str, name: str) -> ObjectKey:
    return ObjectKey(namespace, name)
