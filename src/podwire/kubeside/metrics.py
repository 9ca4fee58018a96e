"""The Kubernetes side's Prometheus metrics, on its controller's registry."""

from __future__ import annotations

import prometheus_client as prom


class KubeMetrics:
    def __init__(self, registry: prom.CollectorRegistry | None) -> None:
        """``registry``: None for a controller without ``[kubernetes] kubeconfig``, which
        exports none of them (an "up" of 0 would read as an outage)."""
        self.api_up = prom.Gauge(
            "podwire_kubernetes_api_up",
            "1 while the leader's informers are answered by the apiserver, 0 while one fails",
            registry=registry,
        )
        self.api_errors = prom.Counter(
            "podwire_kubernetes_api_errors",
            "Failed lists and watches of the Kubernetes API (each retried after a backoff)",
            registry=registry,
        )
        self.netpol_syncs = prom.Counter(
            "podwire_netpol_syncs",
            "NetworkPolicy reconciliation passes against Neutron, by result (ok, failed)",
            ["result"],
            registry=registry,
        )
