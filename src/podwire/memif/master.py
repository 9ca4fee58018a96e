"""The node's ``podwire-memif`` process: starting, recognising and stopping it, and its
control socket (adding and removing memif ports, choosing their path, reading counters).

One master serves every memif port of the node, so two ports can exchange frames ring to ring
(the shared path) without another process in between. The agent binds the control socket
(``<state_dir>/memif-master.sock``, root only) and hands it to the master, which runs in a
session of its own: an agent restart or a signal to the agent's process group leaves every
pod's memif running, and the restarted agent adopts the master it finds (same pid *and* start
time) and reconnects to its control socket.

The control protocol is fixed-size records over SOCK_SEQPACKET: a request of 80 bytes
(op, port name, secret, domain, shared), and one 192-byte reply per request (status and the
master's reason), preceded for ``ports()`` by one record per port. A port's security groups
(``set_policy``) travel as a sealed memfd holding the encoded classifier
(``podwire.sgpolicy.classifier``), which the master checks, copies and swaps in.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import signal
import socket
import stat
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from podwire.config import MemifSettings
from podwire.errors import PermanentError, RetryableError
from podwire.log import get_logger

log = get_logger(__name__)

SOCKET_MODE = 0o666  # the CNF may run as any user; the secret is what admits a client
CONTROL_FILE = "memif-master.sock"
STOP_WAIT = 2.0
CONTROL_TIMEOUT = 2.0

REQUEST = struct.Struct("<I16s28s16sI6s6x")
REPLY_SIZE = 192
LEGACY_REPLY_SIZE = 128  # a master started before #38, adopted across an upgrade, answers so
PORT_RECORD = struct.Struct("<I16s16sIII13Q")
OP_ADD, OP_REMOVE, OP_PATH, OP_LIST, OP_POLICY = 1, 2, 3, 4, 5
POLICY_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
ST_OK, ST_PORT = 0, 2  # any other status is an error, its reason in the text
CONNECTED = 3  # the master's client state once the memif handshake is done


class MasterUnreachable(RetryableError):
    """The master's control socket does not answer (it died, or is starting)."""


class MasterRefused(PermanentError):
    """The master refused a request; its reason is the message."""


@dataclass(frozen=True)
class PortSpec:
    """One memif port as the master serves it: ``name`` is its tap's, ``domain`` the network's
    bridge (only ports of one domain exchange frames ring to ring)."""

    name: str
    socket: str
    secret: str
    domain: str
    shared: bool
    mac: str = ""  # the Neutron port's: the shared path knows it before the CNF sends


@dataclass(frozen=True)
class PortStats:
    name: str
    domain: str
    connected: bool
    shared: bool
    from_client: int
    to_client: int
    to_kernel: int
    to_shared: int
    bad: int
    ring_full: int
    kernel_drops: int
    connects: int
    # Ring to ring under the port's security groups (#38): whether a classifier is in force,
    # frames it admitted, and its drops by reason (each counted on the port whose policy
    # dropped the frame).
    filtered: bool = False
    admitted: int = 0
    spoofed: int = 0  # sent from a MAC or address the port may not use (port security)
    denied: int = 0  # no rule admits it
    invalid: int = 0  # conntrack calls it invalid (or its IP header does not add up)
    flows_full: int = 0  # a new flow, dropped: the master's flow table was full

    @property
    def path(self) -> str:
        return "shared" if self.shared else "kernel"

    @property
    def drops(self) -> int:
        return (
            self.bad
            + self.ring_full
            + self.kernel_drops
            + self.spoofed
            + self.denied
            + self.invalid
            + self.flows_full
        )


def limits_argv(settings: MemifSettings) -> list[str]:
    return [
        f"--max-regions={settings.max_regions}",
        f"--max-rings={settings.max_rings}",
        f"--max-log2-ring={settings.max_log2_ring}",
        f"--max-region-bytes={settings.max_region_mb << 20}",
        f"--handshake-ms={max(1, round(settings.handshake_timeout * 1000))}",
        f"--poll-us={settings.poll_us}",
        f"--max-flows={settings.max_flows}",
    ]


def listen(path: str, mode: int = SOCKET_MODE) -> socket.socket:
    """Bind a SOCK_SEQPACKET socket at ``path``, replacing a stale socket (never another
    file)."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise PermanentError(f"{path} exists and is not a socket; not replacing it")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(path)
        os.chmod(path, mode)
        sock.listen(8)
    except OSError as exc:
        sock.close()
        raise RetryableError(f"cannot listen on {path}: {exc}") from exc
    return sock


def spawn(
    binary: Path,
    control_path: str,
    settings: MemifSettings,
    stderr: int | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[int, int]:
    """Start the node's master on a fresh control socket; returns (pid, start time). Its log
    lines go to ``stderr`` (default: the agent's own); ``extra``: more of its arguments
    (``--max-flows=N``, the connection-tracking table's size, default 100,000)."""
    sock = listen(control_path, 0o600)
    argv = [str(binary), f"--control-fd={sock.fileno()}", *limits_argv(settings), *extra]
    try:
        proc = subprocess.Popen(
            argv,
            pass_fds=(sock.fileno(),),
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    except OSError as exc:
        raise PermanentError(f"cannot start {binary}: {exc.strerror}") from exc
    finally:
        sock.close()
    if settings.nice:
        with contextlib.suppress(OSError):  # the master runs either way; only its priority differs
            os.setpriority(os.PRIO_PROCESS, proc.pid, settings.nice)
    started = start_time(proc.pid)
    return proc.pid, started or 0


class MasterControl:
    """A connection to the master's control socket. Blocking calls (run them on a worker
    thread); one request at a time."""

    def __init__(self, path: str, timeout: float = CONTROL_TIMEOUT) -> None:
        self._path = path
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def add(self, spec: PortSpec, tap_fd: int) -> None:
        """Serve ``spec`` on a fresh memif socket and the given tap. The caller's tap
        descriptor is closed here either way: the master's copy keeps the tap."""
        try:
            sock = listen(spec.socket)
        except BaseException:
            os.close(tap_fd)
            raise
        try:
            request = _request(
                OP_ADD, spec.name, spec.secret, spec.domain, spec.shared, _mac_bytes(spec.mac)
            )
            self._call(request, (sock.fileno(), tap_fd))
        finally:
            sock.close()
            os.close(tap_fd)

    def remove(self, name: str) -> bool:
        """Stop serving ``name`` (its tap goes with the master's descriptor); False when the
        master did not serve it."""
        try:
            self._call(_request(OP_REMOVE, name))
        except MasterRefused as exc:
            if str(exc).endswith("no port of this name"):
                return False
            raise
        return True

    def set_path(self, name: str, shared: bool) -> None:
        """Once this returns, the port's frames take the path asked for."""
        self._call(_request(OP_PATH, name, shared=shared))

    def set_policy(self, name: str, blob: bytes) -> None:
        """Put a port's classifier in force (``classifier.encode``'s blob; an unfiltered one
        clears it). Once this returns, every frame the port exchanges ring to ring is judged
        by it and none was judged by half of it; ``MasterRefused`` names what the master
        refused, and the port keeps the classifier it had."""
        fd = os.memfd_create(f"podwire-policy-{name}", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, POLICY_SEALS)
            self._call(_request(OP_POLICY, name), (fd,))
        finally:
            os.close(fd)

    def ports(self) -> list[PortStats]:
        records = self._call(_request(OP_LIST))
        return [_port_stats(record) for record in records]

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _call(self, request: bytes, fds: tuple[int, ...] = ()) -> list[bytes]:
        with self._lock:
            try:
                return self._exchange(self._connected(), request, fds)
            except OSError as exc:
                self._drop()
                raise MasterUnreachable(f"memif master at {self._path}: {exc}") from exc

    def _connected(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.settimeout(self._timeout)
            try:
                sock.connect(self._path)
            except OSError:
                sock.close()
                raise
            self._sock = sock
        return self._sock

    def _exchange(self, sock: socket.socket, request: bytes, fds: tuple[int, ...]) -> list[bytes]:
        ancillary = []
        if fds:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sock.sendmsg([request], ancillary)
        records = []
        while True:
            reply = sock.recv(REPLY_SIZE + 1)
            if len(reply) not in (REPLY_SIZE, LEGACY_REPLY_SIZE):
                raise ConnectionError(f"reply of {len(reply)} bytes, not {REPLY_SIZE}")
            status = struct.unpack_from("<I", reply)[0]
            if status == ST_PORT:
                records.append(reply)
            elif status == ST_OK:
                return records
            else:
                raise MasterRefused(_text(reply[4:]))

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _request(
    op: int,
    name: str = "",
    secret: str = "",
    domain: str = "",
    shared: bool = False,
    mac: bytes = b"",
) -> bytes:
    return REQUEST.pack(op, name.encode(), secret.encode(), domain.encode(), int(shared), mac)


def _mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", "")) if mac else b""


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _port_stats(record: bytes) -> PortStats:
    record = record.ljust(REPLY_SIZE, b"\0")  # a legacy record has none of the later fields
    _, name, domain, state, shared, filtered, *counters = PORT_RECORD.unpack_from(record)
    (from_client, to_client, to_kernel, to_shared, bad, ring_full, kernel_drops, connects,
     admitted, spoofed, denied, invalid, flows_full) = counters  # fmt: skip
    return PortStats(
        _text(name), _text(domain), state == CONNECTED, bool(shared), from_client, to_client,
        to_kernel, to_shared, bad, ring_full, kernel_drops, connects, bool(filtered), admitted,
        spoofed, denied, invalid, flows_full,
    )  # fmt: skip


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
    """Collect a master that was our child (a restarted agent's adopted one is not)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_running(pid: int, started: int) -> bool:
    """Whether ``pid`` is still the master we started: a pid with the same start time (a reused
    pid cannot have it) that is not a zombie. Works for a master of an earlier agent too."""
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
