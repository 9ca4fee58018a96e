"""Loopback port selection and readiness polling."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from podwire.backoff import Backoff
from podwire.errors import StackError


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_open(port: int) -> bool:
    """Something accepts connections on the loopback port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pick_port(preferred: int) -> int:
    """``preferred`` if it is free (a restarted stack keeps its addresses), else a new one."""
    return preferred if preferred and port_is_free(preferred) else free_port()


def http_ok(url: str, timeout: float = 1.0, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_until(
    check: Callable[[], bool], what: str, timeout: float, alive: Callable[[], bool]
) -> None:
    """Poll ``check`` until true; fail early if the process behind it died."""
    deadline = time.monotonic() + timeout
    backoff = Backoff(0.02, 0.25, factor=1.5)
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            raise StackError(f"{what} exited during start-up; see its log")
        time.sleep(backoff.next())
    raise StackError(f"{what} did not become ready within {timeout:.0f} s; see its log")
