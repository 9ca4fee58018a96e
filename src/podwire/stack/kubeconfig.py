"""Kubeconfig files for the local stack's Kubernetes: one per identity, self-contained.

The CA, cert and key are embedded (as kubeadm's admin.conf has them), so a kubeconfig still
works when copied elsewhere or read from another mount namespace. Written as JSON, which every
Kubernetes client reads as the YAML it is, readable by the owner only (it holds a key).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from podwire.files import atomic_write
from podwire.stack.kube_pki import KeyPair

CLUSTER = "podwire"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def render(server: str, ca_cert: Path, client: KeyPair, user: str) -> dict[str, object]:
    """A kubeconfig whose one context reaches ``server`` as ``user`` with ``client``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [{"name": user, "context": {"cluster": CLUSTER, "user": user}}],
        "current-context": user,
    }


def write(path: Path, server: str, ca_cert: Path, client: KeyPair, user: str) -> None:
    body = json.dumps(render(server, ca_cert, client, user), indent=2) + "\n"
    atomic_write(path, body.encode(), 0o600)
