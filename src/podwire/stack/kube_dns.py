"""Cluster DNS for the stack's Kubernetes: CoreDNS (built by scripts/build-coredns) run by the
stack beside the control plane, serving ``cluster.local`` from the apiserver as the admin.

It runs on this machine, not in a pod, as the apiserver does; pods reach it as they reach
the apiserver, by the Service ``kube-system/kube-dns`` (``DNS_SERVICE_IP``, port 53) whose one
endpoint the stack writes itself: this machine's address and CoreDNS's port (a Service without
a selector and a hand-made EndpointSlice, as the apiserver's own ``kubernetes`` Service is).
Kubelets of the stack's nodes name ``DNS_SERVICE_IP`` as the pods' resolver.
"""

from __future__ import annotations

import sys
from pathlib import Path

from podwire.files import atomic_write

COREDNS = "coredns"
DNS_SERVICE_IP = "10.96.0.10"  # in kube_control.SERVICE_CIDR
MANAGED = {"app.kubernetes.io/managed-by": "podwire-stack"}


def default_binary() -> Path:
    """Where scripts/setup links the build (absent: the stack runs without cluster DNS)."""
    return Path(sys.prefix) / "share" / "podwire-coredns" / COREDNS


def write_corefile(
    path: Path, kubeconfig: Path, port: int, ready_port: int, health_port: int
) -> None:
    """Every address on ``port``; readiness and health on loopback only."""
    text = f""".:{port} {{
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
}}
"""
    atomic_write(path, text.encode(), 0o644)


def argv(binary: Path, corefile: Path) -> list[str]:
    return [str(binary), "-conf", str(corefile)]


def service() -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": MANAGED},
        "spec": {
            "clusterIP": DNS_SERVICE_IP,
            "ports": [
                {"name": "dns", "protocol": "UDP", "port": 53},
                {"name": "dns-tcp", "protocol": "TCP", "port": 53},
            ],
        },
    }


def endpoint_slice(address: str, port: int) -> dict[str, object]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-stack",
            "namespace": "kube-system",
            "labels": {"kubernetes.io/service-name": "kube-dns", **MANAGED},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [
            {"name": "dns", "protocol": "UDP", "port": port},
            {"name": "dns-tcp", "protocol": "TCP", "port": port},
        ],
    }
