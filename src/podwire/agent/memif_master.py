"""Starting, recognising and stopping ``podwire-memif`` processes (one per served memif).

The agent binds the control socket and opens the tap, then hands both descriptors to the
master, which runs in a session of its own: an agent restart or a signal to the agent's
process group leaves every pod's memif running, and the restarted agent adopts the masters it
finds (same pid *and* start time) instead of starting new ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from podwire.config import MemifSettings
from podwire.errors import PermanentError, RetryableError
from podwire.log import get_logger

log = get_logger(__name__)

SOCKET_MODE = 0o666  # the CNF may run as any user; the secret is what admits a client
STOP_WAIT = 2.0


@dataclass(frozen=True)
class MasterSpec:
    name: str  # for the master's log lines
    socket: str
    secret: str


def limits_argv(settings: MemifSettings) -> list[str]:
    return [
        f"--max-regions={settings.max_regions}",
        f"--max-rings={settings.max_rings}",
        f"--max-log2-ring={settings.max_log2_ring}",
        f"--max-region-bytes={settings.max_region_mb << 20}",
        f"--handshake-ms={max(1, round(settings.handshake_timeout * 1000))}",
        f"--poll-us={settings.poll_us}",
    ]


def listen(path: str) -> socket.socket:
    """Bind the grant's control socket, replacing a stale socket (never another file)."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise PermanentError(f"{path} exists and is not a socket; not replacing it")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(path)
        os.chmod(path, SOCKET_MODE)
        sock.listen(8)
    except OSError as exc:
        sock.close()
        raise RetryableError(f"cannot listen on memif socket {path}: {exc}") from exc
    return sock


def spawn(
    binary: Path, spec: MasterSpec, tap_fd: int, settings: MemifSettings, stderr: int | None = None
) -> tuple[int, int]:
    """Start a master on a fresh socket and the given tap; returns (pid, start time). The
    caller's tap descriptor is closed here either way: the master's copy keeps the tap. Its
    log lines go to ``stderr`` (default: the agent's own)."""
    try:
        sock = listen(spec.socket)
    except BaseException:
        os.close(tap_fd)
        raise
    argv = [
        str(binary),
        f"--name={spec.name}",
        f"--listen-fd={sock.fileno()}",
        f"--tap-fd={tap_fd}",
        *limits_argv(settings),
    ]
    try:
        proc = subprocess.Popen(
            argv,
            pass_fds=(sock.fileno(), tap_fd),
            env={"PODWIRE_MEMIF_SECRET": spec.secret},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    except OSError as exc:
        raise PermanentError(f"cannot start {binary}: {exc.strerror}") from exc
    finally:
        sock.close()
        os.close(tap_fd)
    if settings.nice:
        with contextlib.suppress(OSError):  # the master runs either way; only its priority differs
            os.setpriority(os.PRIO_PROCESS, proc.pid, settings.nice)
    started = start_time(proc.pid)
    return proc.pid, started or 0


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when there is no such one."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    # After "pid (comm)": state is field 3; starttime is field 22.
    return int(fields[19]) if len(fields) > 19 else None


def reap(pid: int) -> None:
    """Collect a master that was our child (a restarted agent's adopted ones are not)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_running(pid: int, started: int) -> bool:
    """Whether ``pid`` is still the master we started: a pid with the same start time (a reused
    pid cannot have it) that is not a zombie. Works for masters of an earlier agent too."""
    if pid <= 0:
        return False
    reap(pid)
    if start_time(pid) != started:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop(pid: int, started: int) -> None:
    """SIGTERM, then SIGKILL after a grace period; blocking (run it on a worker thread)."""
    if not is_running(pid, started):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT
    while time.monotonic() < deadline:
        if not is_running(pid, started):
            return
        time.sleep(0.01)
    log.warning("agent.memif.master_killed", pid=pid, reason="did not stop on SIGTERM")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while is_running(pid, started):
        time.sleep(0.01)


def remove_socket(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
