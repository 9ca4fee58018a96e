"""Prometheus metrics of the agent (served by the ops endpoint's /metrics)."""

from __future__ import annotations

import prometheus_client as prom

PORTS_WIRED = prom.Counter("podwire_agent_ports_wired", "Desired ports wired on this host")
BIND_FAILURES = prom.Counter("podwire_agent_bind_failures", "Desired ports that failed to wire")
CNI_REQUESTS = prom.Counter(
    "podwire_agent_cni_requests", "CNI requests handled", ["command", "result"]
)
CNI_SECONDS = prom.Histogram(
    "podwire_agent_cni_seconds",
    "Time the agent spent on a CNI request",
    ["command"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
ATTACHMENTS = prom.Gauge("podwire_agent_attachments", "Pod attachments in the checkpoint")
HEARTBEAT_LOST = prom.Counter("podwire_agent_lease_lost", "Heartbeat leases lost and re-granted")
