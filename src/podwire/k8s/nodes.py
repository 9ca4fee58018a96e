"""The strict reader of the Nodes the controller follows: only which nodes the API has, so
that one deleted from it releases what podwire held for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podwire.k8s.objects import Meta, read_meta
from podwire.schema.doc import as_object


@dataclass(frozen=True)
class K8sNode:
    meta: Meta


def read_node(value: Any) -> K8sNode:
    body = as_object(value, "node")
    return K8sNode(read_meta(body.get("metadata"), "node", namespaced=False))
