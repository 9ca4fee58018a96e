"""Prometheus metrics of one agent, on a registry of its own (served by its /metrics).

A registry per agent, as the controller has one, lets tests and the bench run several agents
in one process without their counts mixing; the embedded device plugin's figures join the
same registry, so one scrape shows the whole node.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

CNI_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class MemifCounters(Protocol):
    """What the metrics read of a memif port's counters (``podwire.memif.master.PortStats``): a
    seam, so the metrics, which every part of the agent uses, depend on none of them."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def from_client(self) -> int: ...
    @property
    def to_client(self) -> int: ...
    @property
    def to_kernel(self) -> int: ...
    @property
    def to_shared(self) -> int: ...
    @property
    def bad(self) -> int: ...
    @property
    def ring_full(self) -> int: ...
    @property
    def kernel_drops(self) -> int: ...
    @property
    def admitted(self) -> int: ...
    @property
    def spoofed(self) -> int: ...
    @property
    def denied(self) -> int: ...
    @property
    def invalid(self) -> int: ...
    @property
    def flows_full(self) -> int: ...


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
        self.attachment_repairs = prom.Counter(
            "podwire_agent_attachment_repairs",
            "Pods whose veth was found deleted or off its bridge and plugged again",
            registry=r,
        )
        self.attachments = prom.Gauge(
            "podwire_agent_attachments", "Pod attachments in the checkpoint", registry=r
        )
        self.memifs = prom.Gauge(
            "podwire_agent_memifs", "memif interfaces this agent's master serves",
            registry=r,
        )  # fmt: skip
        self.memif_master_restarts = prom.Counter(
            "podwire_agent_memif_master_restarts",
            "Times the node's memif master was found dead and started again",
            registry=r,
        )
        self.memif_ports = MemifPorts()
        r.register(self.memif_ports)
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
        self.policy_repairs = prom.Counter(
            "podwire_agent_policy_repairs",
            "Times podwire's nftables tables were found changed behind the agent (flushed,"
            " edited) and replaced whole",
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
        self.peer_values_rejected = prom.Counter(
            "podwire_agent_peer_values_rejected",
            "Values other nodes wrote that this agent refused (vtep, port_state: unreadable;"
            " claim: a port Neutron did not bind to that node, or not as claimed; over_limit:"
            " past the claims one node may hold)",
            ["kind"],
            registry=r,
        )
        self.peer_repairs = prom.Counter(
            "podwire_agent_peer_repairs",
            "Kernel entries for other nodes (flood list, remote MACs, ARP/ND answers) found"
            " changed behind the agent's back and put back",
            registry=r,
        )
        self.task_restarts = prom.Counter(
            "podwire_agent_task_restarts",
            "Long-running parts restarted after a failure nobody foresaw",
            ["task"],
            registry=r,
        )
        self.heartbeat_lost = prom.Counter(
            "podwire_agent_lease_lost", "Heartbeat leases lost and re-granted", registry=r
        )

    def observe_memifs(
        self, stats: Mapping[str, MemifCounters], port_ids: Mapping[str, str]
    ) -> None:
        """The master's counters as of the last supervision pass (read at scrape time)."""
        self.memif_ports.snapshot = [(port_ids.get(name, ""), s) for name, s in stats.items()]


class MemifPorts:
    """Per memif port: the path in use, frames each way, drops by reason (the master's own
    counters; they start again from 0 when the master is restarted)."""

    def __init__(self) -> None:
        self.snapshot: list[tuple[str, MemifCounters]] = []

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        labels = ["port", "tap"]
        path = GaugeMetricFamily(
            "podwire_agent_memif_path", "1 for the path a memif port's frames take",
            labels=[*labels, "path"],
        )  # fmt: skip
        frames = CounterMetricFamily(
            "podwire_agent_memif_frames", "Frames a memif port moved, by direction",
            labels=[*labels, "direction"],
        )  # fmt: skip
        drops = CounterMetricFamily(
            "podwire_agent_memif_drops",
            "Frames of a memif port dropped: bad (descriptor, length), ring_full (the CNF "
            "offered no buffer), kernel (the tap refused it); by the master's classifier: "
            "spoofed (port security), denied (no rule admits), invalid (connection tracking), "
            "flows_full (no room for a new flow)",
            labels=[*labels, "reason"],
        )
        admitted = CounterMetricFamily(
            "podwire_agent_memif_admitted",
            "Frames the master's classifiers admitted ring to ring (ports with security groups "
            "on the shared path)",
            labels=labels,
        )
        for port_id, s in self.snapshot:
            ids = [port_id, s.name]
            path.add_metric([*ids, s.path], 1)
            for direction, count in (
                ("from_client", s.from_client), ("to_client", s.to_client),
                ("to_kernel", s.to_kernel), ("to_shared", s.to_shared),
            ):  # fmt: skip
                frames.add_metric([*ids, direction], count)
            for reason, count in (
                ("bad", s.bad), ("ring_full", s.ring_full), ("kernel", s.kernel_drops),
                ("spoofed", s.spoofed), ("denied", s.denied), ("invalid", s.invalid),
                ("flows_full", s.flows_full),
            ):  # fmt: skip
                drops.add_metric([*ids, reason], count)
            admitted.add_metric(ids, s.admitted)
        yield from (path, frames, drops, admitted)
