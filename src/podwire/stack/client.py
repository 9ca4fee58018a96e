"""Starting a stack in the background: shared by the demo, the tests and the benches."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from podwire.errors import StackError


def start_background(
    data_dir: Path, timeout: float = 180.0, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Run ``podwire stack up`` as a child and return it with its stack.json once ready."""
    data_dir.mkdir(parents=True, exist_ok=True)
    console = (data_dir / "console.log").open("ab")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "podwire.cli.main", "stack", "up"),
            *("--data-dir", str(data_dir), *extra),
        ],
        stdout=console,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"stack up exited with {proc.returncode}; see {console.name}")
        info = _read(data_dir / "stack.json")
        if info.get("pids", {}).get("supervisor") == proc.pid:
            return proc, info
        time.sleep(0.1)
    proc.kill()
    raise StackError(f"stack not ready after {timeout:.0f} s; see {console.name}")


def stop_background(proc: subprocess.Popen[bytes], timeout: float = 90.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=timeout)


def _read(path: Path) -> dict[str, Any]:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}
