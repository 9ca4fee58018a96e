"""The pods the demo and the tests make through the API, on the images every kube-node
imports (``imagePullPolicy: Never``: there is no registry)."""

from __future__ import annotations

from typing import Any

from podwire.kube.cnf import TESTPMD_IMAGE
from podwire.kube.images import TOOLBOX_IMAGE

MEMIF_RESOURCE = "podwire.io/memif"


def pod(name: str, namespace: str, container: dict[str, Any], node: str = "") -> dict[str, Any]:
    """On ``node`` if given, else wherever the scheduler puts it."""
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 1}
    if node:
        spec["nodeName"] = node
    metadata = {"name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def toolbox_pod(name: str, namespace: str, node: str = "") -> dict[str, Any]:
    """A pod that sleeps, with ping, nc, wget and nslookup to probe the network."""
    container = {
        "name": "toolbox",
        "image": TOOLBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
    }
    return pod(name, namespace, container, node)


def testpmd_pod(name: str, namespace: str, node: str = "") -> dict[str, Any]:
    """The memif CNF: one ``podwire.io/memif`` device; stdin open, as testpmd exits at EOF."""
    container = {
        "name": "testpmd",
        "image": TESTPMD_IMAGE,
        "imagePullPolicy": "Never",
        "stdin": True,
        "resources": {"limits": {MEMIF_RESOURCE: "1"}},
    }
    return pod(name, namespace, container, node)
