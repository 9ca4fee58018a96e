"""The host end of a VM's command channel: QEMU's second serial port on a unix socket.

The guest's ``agent`` (guest/agent) reads one request per line, ``ID SECONDS BASE64(script)``,
runs the script with ``timeout -s KILL SECONDS`` and answers ``podwire-vm result ID RC
BASE64(output)``. Base64 both ways keeps quoting, binary output and stray bytes from ever
breaking a line; the id pairs each answer with its request, so an answer that arrives after
its caller gave up is recognised and dropped. One request is in flight at a time.
"""

from __future__ import annotations

import base64
import binascii
import socket
import threading
import time
from typing import NamedTuple

from podwire.errors import VmCommandTimeout, VmError

READY = b"podwire-vm ready"
RESULT = b"podwire-vm result "
KILLED = 137  # 128 + SIGKILL: what the guest's `timeout -s KILL` leaves
TRANSPORT_MARGIN = 10.0  # seconds beyond a command's limit before the guest counts as gone
MAX_LINE = 1 << 20


class CommandResult(NamedTuple):
    """What a guest command left: ``rc, output = vm.run(...)``."""

    rc: int
    output: str  # stdout and stderr together, at most 64 KiB


class ControlChannel:
    def __init__(self, sock: socket.socket, name: str) -> None:
        self._sock = sock
        self._name = name
        self._buffer = b""
        self._next_id = 1
        self._lock = threading.Lock()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._read_line(deadline, "to start its command channel") != READY:
            pass

    def call(self, script: str, timeout: float) -> CommandResult:
        if not 1 <= timeout <= 86400:
            raise VmError(f"command time limit {timeout} s is outside 1..86400 s")
        with self._lock:
            request_id = self._next_id
            self._next_id += 1
            encoded = base64.b64encode(script.encode()).decode()
            self._send(f"{request_id} {int(timeout)} {encoded}\n".encode())
            started = time.monotonic()
            result = self._result(request_id, started + timeout + TRANSPORT_MARGIN)
        if result.rc == KILLED and time.monotonic() - started >= timeout:
            raise VmCommandTimeout(f"VM {self._name}: {script!r} ran over its {timeout:.0f} s")
        return result

    def close(self) -> None:
        self._sock.close()

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise VmError(f"VM {self._name}: command channel closed ({exc.strerror})") from exc

    def _result(self, request_id: int, deadline: float) -> CommandResult:
        prefix = RESULT + b"%d " % request_id
        while True:
            line = self._read_line(deadline, "to answer a command")
            if line.startswith(prefix):
                return _parse_result(line[len(prefix) :], self._name)

    def _read_line(self, deadline: float, waiting_for: str) -> bytes:
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise VmError(f"VM {self._name} took too long {waiting_for}")
            if len(self._buffer) > MAX_LINE:
                raise VmError(f"VM {self._name}: a line on the command channel exceeds 1 MiB")
            self._buffer += self._receive(remaining)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.strip(b"\r")

    def _receive(self, timeout: float) -> bytes:
        self._sock.settimeout(timeout)
        try:
            chunk = self._sock.recv(65536)
        except TimeoutError:
            return b""
        except OSError as exc:
            raise VmError(f"VM {self._name}: command channel failed ({exc.strerror})") from exc
        if not chunk:
            raise VmError(f"VM {self._name}: command channel closed (QEMU exited?)")
        return chunk


def _parse_result(rest: bytes, name: str) -> CommandResult:
    rc_text, _, encoded = rest.partition(b" ")
    try:
        return CommandResult(
            int(rc_text), base64.b64decode(encoded, validate=True).decode(errors="replace")
        )
    except (ValueError, binascii.Error) as exc:
        raise VmError(f"VM {name}: malformed answer on the command channel") from exc
