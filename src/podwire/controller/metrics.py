"""Prometheus metrics of one controller, on a registry of its own.

A registry per controller (not the process-global one) lets tests and the bench run several
controllers in one process without name clashes.
"""

from __future__ import annotations

import prometheus_client as prom


class ControllerMetrics:
    def __init__(self, registry: prom.CollectorRegistry | None = None) -> None:
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.pool_size = prom.Gauge(
            "podwire_pool_ports", "Ready ports per pool", ["node", "project", "network"], registry=r
        )
        self.hits = prom.Counter("podwire_pool_hits", "Requests served from the pool", registry=r)
        self.reuses = prom.Counter(
            "podwire_pool_sg_reuses", "Requests served by re-SG of another group", registry=r
        )
        self.misses = prom.Counter(
            "podwire_pool_misses", "Requests that found their pool empty", registry=r
        )
        self.refill_seconds = prom.Histogram(
            "podwire_pool_refill_seconds", "Duration of one pool refill", registry=r
        )
        self.neutron_calls = prom.Counter(
            "podwire_neutron_calls", "Neutron API calls", ["op"], registry=r
        )
        self.neutron_errors = prom.Counter(
            "podwire_neutron_errors", "Failed Neutron API calls", ["op"], registry=r
        )
        self.inuse_retries = prom.Counter(
            "podwire_inuse_write_retries",
            "In-use record transactions sent again after etcd did not answer",
            registry=r,
        )
        self.nodes_released = prom.Counter(
            "podwire_nodes_released",
            "Nodes whose ports were all released: removed by an operator, or dead too long",
            ["reason"],
            registry=r,
        )
        self.in_use = prom.Gauge("podwire_vifs_in_use", "Attachments holding a port", registry=r)
