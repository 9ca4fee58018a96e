"""Shared figures for every bench: timings, medians, p99 and the row format the table prints."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any


async def timed(call: Callable[..., Awaitable[Any]], *args: Any) -> float:
    """Milliseconds from calling ``call`` until what it returns is done."""
    started = time.perf_counter()
    await call(*args)
    return (time.perf_counter() - started) * 1000


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def row(
    name: str,
    samples_ms: list[float],
    reference: str = "",
    reference_ms: list[float] | None = None,
    unit: str = "ms",
) -> dict[str, Any]:
    """One table row; ``ratio`` is ours / reference on the medians (lower is better)."""
    p50 = statistics.median(samples_ms)
    result: dict[str, Any] = {
        "name": name,
        "samples": len(samples_ms),
        "p50_ms": p50,
        "p99_ms": percentile(samples_ms, 0.99),
        "reference": reference,
        "ratio": None,
        "unit": unit,
    }
    if reference_ms:
        ref_p50 = statistics.median(reference_ms)
        result["reference"] = f"{reference}: p50 {ref_p50:.2f} {unit}"
        result["ratio"] = p50 / ref_p50 if ref_p50 else None
    return result


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| benchmark | samples | p50 | p99 | reference (same run) | ratio |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for item in rows:
        unit = item.get("unit", "ms")
        ratio = f"{item['ratio']:.3g}x" if item.get("ratio") else "-"
        lines.append(
            f"| {item['name']} | {item['samples']} | {item['p50_ms']:.2f} {unit}"
            f" | {item['p99_ms']:.2f} {unit} | {item['reference'] or '-'} | {ratio} |"
        )
    return "\n".join(lines)
