"""Following a VM's serial console (ttyS0): a log with host timestamps, and guest events.

The guest's init and DHCP hook print ``podwire-vm: <event>`` lines (``init``, ``dhcp
discover``, ``dhcp bound ip=...``). A thread reads the console socket as QEMU writes it,
stamps each line with the host's monotonic clock on arrival and keeps the events, so boot and
lease times are measured on the host's clock from QEMU's start, with no guest clock involved
and no polling. The log (``console.log``) shows every line with its offset from that start.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

EVENT = "podwire-vm: "


@dataclass(frozen=True)
class ConsoleEvent:
    at: float  # host monotonic time the line arrived
    text: str  # the line after "podwire-vm: "


class ConsoleFollower:
    def __init__(self, sock: socket.socket, log_path: Path, started_at: float) -> None:
        self._sock = sock
        self._log_path = log_path
        self._started_at = started_at
        self._events: list[ConsoleEvent] = []
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._follow, name="vm-console", daemon=True)
        self._thread.start()

    def wait(self, prefix: str, timeout: float, after: float = 0.0) -> ConsoleEvent | None:
        """The first event starting with ``prefix`` that arrived after ``after``; None if
        none came within ``timeout`` or the console closed (QEMU exited) first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = self._first(prefix, after)
                remaining = deadline - time.monotonic()
                if found or self._closed or remaining <= 0:
                    return found
                self._changed.wait(remaining)

    def events(self) -> list[ConsoleEvent]:
        with self._changed:
            return list(self._events)

    def join(self, timeout: float = 5.0) -> None:
        self._thread.join(timeout)

    def _first(self, prefix: str, after: float) -> ConsoleEvent | None:
        return next((e for e in self._events if e.at > after and e.text.startswith(prefix)), None)

    def _follow(self) -> None:
        try:
            with self._log_path.open("w", encoding="utf-8") as log:
                self._copy(log)
        finally:
            self._sock.close()
            with self._changed:
                self._closed = True
                self._changed.notify_all()

    def _copy(self, log: TextIO) -> None:
        pending = b""
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            now = time.monotonic()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self._line(log, now, raw.decode(errors="replace").strip("\r"))

    def _line(self, log: TextIO, now: float, text: str) -> None:
        log.write(f"[+{now - self._started_at:8.3f}] {text}\n")
        log.flush()
        start = text.find(EVENT)  # a kernel message may share the line
        if start >= 0:
            with self._changed:
                self._events.append(ConsoleEvent(now, text[start + len(EVENT) :]))
                self._changed.notify_all()
