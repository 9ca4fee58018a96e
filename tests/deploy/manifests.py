"""The objects of deploy/ as the tests read them, and what each podwire component asks of the
Kubernetes API (the RBAC deploy/ must grant it, and nothing more)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

# (verb, API group, resource, namespace or "" for every namespace and cluster-scoped resources)
Need = tuple[str, str, str, str]

# What each component's code asks the Kubernetes API for, by its ServiceAccount. The agent
# makes no API call: it wires pods from the CNI calls the runtime makes on its socket and
# serves the device plugin on kubelet's unix sockets (registration, Allocate, PodResources),
# none of which goes through the apiserver. The controller's leader, with [kubernetes]
# (kubeside/side.py), runs an informer each over Namespaces, Pods, Nodes and
# NetworkPolicies in every namespace: list and watch (k8s/api.py); get, as every informer's
# rules have it, for a single object the cache does not hold yet (a pod at its ADD). It
# writes only a pod's own annotations (patch pods: the port it shows), Events naming
# failures (create, never patched) and its finalizer on namespaces (patch namespaces). No
# Secret: configuration and credentials reach both as files and variables the kubelet fills
# from the ConfigMap and the Secrets, with the kubelet's own rights. A need added here must
# be granted by deploy/, and a grant in deploy/ needs its line here.
NEEDS: dict[str, frozenset[Need]] = {
    "podwire-agent": frozenset(),
    "podwire-controller": frozenset(
        (verb, group, resource, "")
        for group, resource in (
            ("", "namespaces"),
            ("", "pods"),
            ("", "nodes"),
            ("", "services"),
            ("networking.k8s.io", "networkpolicies"),
            ("discovery.k8s.io", "endpointslices"),
        )
        for verb in ("get", "list", "watch")
    )
    # the pod annotations showing its port, and Events naming failures
    | {("patch", "", "pods", ""), ("create", "", "events", "")}
    # the finalizer on a namespace whose network podwire made (kubeside/ns_networks.py)
    | {("patch", "", "namespaces", "")},
}


def documents() -> list[tuple[str, dict[str, Any]]]:
    """Every object of deploy/*.yaml, in file order, named ``file:Kind/name``."""
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found
