"""The device plugin's figures (``DevicePlugin.stats()``) as Prometheus metrics.

Read at scrape time rather than mirrored into gauges, so the plugin keeps counting in plain
ints and a scrape always shows the allocator's current state. The agent registers this on
its own registry, next to its metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from podwire.deviceplugin.stats import COUNTERS

PREFIX = "podwire_deviceplugin_"


class StatsCollector:
    def __init__(self, read: Callable[[], dict[str, int]]) -> None:
        self._read = read

    def describe(self) -> list[Any]:
        """Nothing up front: registering must not read a plugin that is not running yet."""
        return []

    def collect(self) -> Iterator[Any]:
        for name, value in sorted(self._read().items()):
            if name in COUNTERS:
                yield CounterMetricFamily(PREFIX + name, f"Device plugin {name}", value=value)
            else:
                yield GaugeMetricFamily(PREFIX + name, f"Device plugin {name}", value=value)
