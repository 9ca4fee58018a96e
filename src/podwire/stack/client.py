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
    try:
        return proc, _wait_ready(proc, data_dir, timeout, console.name)
    except BaseException:
        # Not ready, or interrupted (Ctrl-C) while it starts: its supervisor stops what it
        # started so far (a SIGKILL would leave etcd, MariaDB and Neutron running).
        stop_background(proc)
        raise


def _wait_ready(
    proc: subprocess.Popen[bytes], data_dir: Path, timeout: float, console: str
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"stack up exited with {proc.returncode}; see {console}")
        info = _read(data_dir / "stack.json")
        if info.get("pids", {}).get("supervisor") == proc.pid:
            return info
        time.sleep(0.1)
    raise StackError(f"stack not ready after {timeout:.0f} s; see {console}")


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
