"""How long `podwire stack up` takes to answer: first start and restart on the same data."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import row
from podwire.stack.client import start_background, stop_background


def measure(data_dir: Path) -> float:
    started = time.perf_counter()
    proc, _ = start_background(data_dir)
    elapsed = (time.perf_counter() - started) * 1000
    stop_background(proc)
    return elapsed


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="pwb-", dir="/tmp") as tmp:
        data_dir = Path(tmp) / "s"
        cold = measure(data_dir)
        warm = [measure(data_dir) for _ in range(2)]
    return [
        row("stack up, empty data dir (s)", [cold / 1000], unit="s"),
        row("stack up, restart on existing data (s)", [w / 1000 for w in warm], unit="s"),
    ]
