"""Starting, watching and stopping the stack's child processes by PID.

Children get a parent-death signal through util-linux ``setpriv --pdeathsig`` (no
``preexec_fn`` runs between fork and exec, which is unsafe in a process with gRPC threads), so
a supervisor killed with SIGKILL does not leave them running. A crashed supervisor's children
that survived anyway are found again through the PIDs in ``stack.json`` and recognised by their
exact recorded command line, so a recycled PID of some unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from podwire.errors import StackError


def _with_parent_death_signal(
    argv: Sequence[str], user: str | None, death_signal: str = "TERM"
) -> list[str]:
    """``argv`` under setpriv: the parent-death signal, and the user to run as if any.

    One setpriv does both, the signal set after the user change: the kernel clears a
    parent-death signal when a process's credentials change.
    """
    setpriv = shutil.which("setpriv")
    if not setpriv:
        if user:
            raise StackError("setpriv (util-linux) is needed to run a child as another user")
        return list(argv)
    as_user = ["--reuid", user, "--regid", user, "--init-groups"] if user else []
    return [setpriv, *as_user, "--pdeathsig", death_signal, "--", *argv]


def spawn(
    argv: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    new_session: bool = False,
    death_signal: str = "TERM",
) -> subprocess.Popen[bytes]:
    """``new_session``: out of the terminal's process group, so a Ctrl-C reaches only the
    parent, which then stops the child in its own order."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        try:
            return subprocess.Popen(
                _with_parent_death_signal(argv, user, death_signal),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=new_session,
            )
        except OSError as exc:
            raise StackError(f"cannot start {argv[0]}: {exc.strerror}") from exc


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def is_ours(pid: int, marker: str) -> bool:
    """True if ``pid`` runs and its command line mentions ``marker`` (the data dir)."""
    return pid > 0 and marker in cmdline(pid)


def pids_marked(marker: str) -> list[int]:
    """Every running process whose command line mentions ``marker`` (a data dir of ours)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and is_ours(int(entry.name), marker):
            found.append(int(entry.name))
    return sorted(found)


def terminate(pid: int, marker: str, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``; returns True if a process of ours was stopped."""
    if not is_ours(pid, marker):
        return False
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.05)
    _signal(pid, signal.SIGKILL)
    while running(pid):
        time.sleep(0.05)
    return True


def stop_child(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie child of ours is already stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
