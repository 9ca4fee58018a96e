"""TCP probes inside pod namespaces: a listener, and a client that tells refused from dropped.

Both are small Python programs run with ``ip netns exec`` (a pod's process, as a runtime would
start it); the demo ends them by pid. Times are CLOCK_MONOTONIC, which every process on the
machine shares, so the client's moment of success compares with the demo's own clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from podwire.errors import StackError

Popen = subprocess.Popen[str]

_LISTENER = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(sys.argv[1])))
server.listen(64)
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    conn.close()
"""

# One attempt per fresh socket (a new source port, so a new flow for the filter each time).
_CONNECT = """
import json, socket, sys, time
host, port, each, total = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
source = (sys.argv[5], 0) if len(sys.argv) > 5 else None
deadline, attempts, outcome = time.monotonic() + total, 0, "timed out"
print("probing", flush=True)
while True:
    attempts += 1
    try:
        socket.create_connection((host, port), timeout=each, source_address=source).close()
        outcome = "connected"
    except ConnectionRefusedError:
        outcome = "refused"
    except OSError:
        outcome = "timed out"
    if outcome == "connected" or time.monotonic() >= deadline:
        break
print(json.dumps({"outcome": outcome, "at": time.monotonic(), "attempts": attempts}))
"""


@dataclass(frozen=True)
class Probe:
    outcome: str  # "connected", "refused" or "timed out"
    at: float  # monotonic time of the last attempt's end
    attempts: int


def _in_netns(netns: str, program: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", netns, sys.executable, "-c", program, *args]


def start_listener(netns: str, port: int) -> Popen:
    """A TCP server in ``netns`` that accepts and closes; returns once it listens."""
    return _started(netns, _LISTENER, [str(port)], "listening", "TCP listener", subprocess.DEVNULL)


def connect(
    netns: str, address: str, port: int, each: float, total: float = 0.0, source: str = ""
) -> Probe:
    """Connect from ``netns`` (from ``source`` if given); retries every ``each`` seconds until
    connected or ``total``."""
    return finish_connect(start_connect(netns, address, port, each, total, source), netns)


def start_connect(
    netns: str, address: str, port: int, each: float, total: float, source: str = ""
) -> Popen:
    """``connect`` in the background: returns once it probes, before the change to notice."""
    args = [address, str(port), str(each), str(total), *([source] if source else [])]
    return _started(netns, _CONNECT, args, "probing", "TCP probe", subprocess.PIPE)


def _started(
    netns: str, program: str, args: list[str], ready: str, what: str, stderr: int
) -> Popen:
    """``program`` running in ``netns``, once it has printed its ``ready`` line."""
    proc = subprocess.Popen(
        _in_netns(netns, program, *args), stdout=subprocess.PIPE, stderr=stderr, text=True
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != ready:
        stop(proc)
        raise StackError(f"{what} in {netns} did not start")
    return proc


def finish_connect(proc: Popen, netns: str) -> Probe:
    """Read through the pipe's file object, not ``communicate``: reading the ready line may
    have buffered the result line too (a refusal comes back at once), and ``communicate``
    reads the descriptor past that buffer. The two lines are far below a pipe's capacity, so
    waiting for the exit first cannot block the probe."""
    assert proc.stdout is not None and proc.stderr is not None
    try:
        proc.wait(timeout=120)
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        stop(proc)
    if proc.returncode != 0:
        raise StackError(f"TCP probe in {netns} failed: {err.strip()[-200:]}")
    found = json.loads(out)
    return Probe(str(found["outcome"]), float(found["at"]), int(found["attempts"]))


def stop(proc: Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
