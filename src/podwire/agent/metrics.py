"""Prometheus metrics of one agent, on a registry of its own (served by its /metrics).

A registry per agent, as the controller has one, lets tests and the bench run several agents
in one process without their counts mixing; the embedded device plugin's figures join the
same registry, so one scrape shows the whole node.
"""

from __future__ import annotations

import prometheus_client as prom

CNI_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class AgentMetrics:
    def __init__(self, registry: prom.CollectorRegistry | None = None) -> None:
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.ports_wired = prom.Counter(
            "podwire_agent_ports_wired", "Desired ports wired on this host", registry=r
        )
        self.bind_failures = prom.Counter(
            "podwire_agent_bind_failures", "Desired ports that failed to wire", registry=r
        )
        self.cni_requests = prom.Counter(
            "podwire_agent_cni_requests", "CNI requests handled", ["command", "result"], registry=r
        )
        self.cni_seconds = prom.Histogram(
            "podwire_agent_cni_seconds",
            "Time the agent spent on a CNI request",
            ["command"],
            buckets=CNI_BUCKETS,
            registry=r,
        )
        self.attachments = prom.Gauge(
            "podwire_agent_attachments", "Pod attachments in the checkpoint", registry=r
        )
        self.memifs = prom.Gauge(
            "podwire_agent_memifs", "memif interfaces this agent serves (one master each)",
            registry=r,
        )  # fmt: skip
        self.memif_master_restarts = prom.Counter(
            "podwire_agent_memif_master_restarts",
            "memif masters found dead and started again",
            registry=r,
        )
        self.taps = prom.Gauge(
            "podwire_agent_taps", "Tap ports (VMs, Neutron agents) whose device is adopted",
            registry=r,
        )  # fmt: skip
        self.tap_adoptions = prom.Counter(
            "podwire_agent_tap_adoptions",
            "Tap devices adopted, and adoptions retried",
            ["result"],
            registry=r,
        )
        self.tap_adopt_seconds = prom.Histogram(
            "podwire_agent_tap_adopt_seconds",
            "From a tap device's appearance to its port reported wired",
            buckets=CNI_BUCKETS,
            registry=r,
        )
        self.policy_applies = prom.Counter(
            "podwire_agent_policy_applies",
            "Security-group rulesets applied to nftables (replace, change, failed)",
            ["kind"],
            registry=r,
        )
        self.policy_text_fallbacks = prom.Counter(
            "podwire_agent_policy_element_text_fallbacks",
            "Set element changes sent through libnftables as text, not packed: sets the packer"
            " does not encode (none of podwire's own); each costs a parse and a cache dump",
            registry=r,
        )
        self.policy_seconds = prom.Histogram(
            "podwire_agent_policy_apply_seconds",
            "Time to compile and apply one security-group change",
            buckets=CNI_BUCKETS,
            registry=r,
        )
        self.policy_ports = prom.Gauge(
            "podwire_agent_policy_enforced_ports", "Ports with port security enforced", registry=r
        )
        self.policy_problems = prom.Gauge(
            "podwire_agent_policy_problems",
            "Rules, groups or members left out because they did not parse or are missing",
            registry=r,
        )
        self.heartbeat_lost = prom.Counter(
            "podwire_agent_lease_lost", "Heartbeat leases lost and re-granted", registry=r
        )
