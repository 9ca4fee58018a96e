"""How many Neutron calls a controller has made for work, read from its own counter."""

from __future__ import annotations

from podwire.controller.metrics import ControllerMetrics


def neutron_call_count(metrics: ControllerMetrics) -> float:
    """The leader's readiness probes (``op="probe"``) are not counted: tests and the bench
    check that a hot path adds no call, whatever the probes do meanwhile."""
    total = 0.0
    for metric in metrics.neutron_calls.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels.get("op") != "probe":
                total += sample.value
    return total
