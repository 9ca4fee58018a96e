#!/usr/bin/env python3
"""podwire's CNI plugin, stdlib-only fallback of the C build (same behaviour, same tests).

A pipe: it forwards the CNI environment and the network config to the podwire agent's unix
socket and prints the agent's reply with the agent's exit code. It answers VERSION itself and,
when the agent cannot be reached, prints a CNI error itself: 50 for STATUS, 11 otherwise.
Installed as a script, so it must not import anything outside the standard library.

Limits and bytes are those of the C build (see its header): stdin at most 1 MiB for ADD and
1 MiB + 256 KiB for the other commands, stdin and CNI_* values must be UTF-8 (refused with 6
and 4 otherwise, never altered), non-ASCII is sent as UTF-8 (so the request is no larger than
the C build's), and an agent that closes before reading everything still has its answer printed.
"""

import json
import os
import socket
import sys

SUPPORTED = ["0.4.0", "1.0.0", "1.1.0"]
DEFAULT_SOCKET = "/run/podwire/agent.sock"  # config.AGENT_SOCKET (no import: stdlib only)
ENV_KEYS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
TIMEOUT = 300.0
MAX_CONFIG = 1 << 20
MAX_CONFIG_EXTRA = 256 << 10
DECODE_FAILURE = 6
INVALID_ENV = 4


def _error(code: int, msg: str) -> int:
    sys.stdout.write(json.dumps({"cniVersion": "1.1.0", "code": code, "msg": msg}))
    return code


def _socket_path(config: str) -> str:
    try:
        value = json.loads(config).get("agentSocket")
    except (ValueError, AttributeError, RecursionError):  # deep nesting: the agent says so
        value = None
    if isinstance(value, str) and value:
        return value
    # A config too broken to name its socket still reaches the agent, which explains the error.
    return os.environ.get("PODWIRE_CNI_SOCKET") or DEFAULT_SOCKET


def _exchange(path: str, request: bytes) -> bytes:
    """The agent's reply. A failed send still reads what the agent answered before closing
    (e.g. that the request is too large): that answer says more than the broken pipe."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(path)
        try:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            reply = _read_all(sock)
            if not reply:
                raise OSError(f"closed before reading the request: {exc}") from exc
            return reply
        return _read_all(sock)


def _read_all(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionError:
            chunk = b""
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _read_config(command: str) -> str:
    limit = MAX_CONFIG + (0 if command == "ADD" else MAX_CONFIG_EXTRA)
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise _Refused(
            DECODE_FAILURE, f"network config on stdin is too large: more than {limit} bytes"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Refused(
            DECODE_FAILURE,
            f"network config on stdin is not valid UTF-8: invalid byte at offset {exc.start}",
        ) from exc


def _environment(command: str) -> dict[str, str]:
    env = {key: os.environ[key] for key in ENV_KEYS if key in os.environ}
    for key, value in list(env.items()):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # os.environ keeps undecodable bytes as surrogates
            if command == "DEL" and key == "CNI_NETNS":
                del env[key]  # DEL must succeed whatever its netns (the agent ignores it there)
                continue
            raise _Refused(INVALID_ENV, f"environment variable is not valid UTF-8: {key}") from exc
    return env


AGENT_HINT = "is the node's podwire agent running on that socket?"


class _Refused(Exception):
    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg


def main() -> int:
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        sys.stdout.write(json.dumps({"cniVersion": "1.1.0", "supportedVersions": SUPPORTED}))
        return 0
    try:
        config = _read_config(command)
        env = _environment(command)
    except _Refused as exc:
        return _error(exc.code, exc.msg)
    request = json.dumps({"env": env, "stdin": config}, ensure_ascii=False).encode()
    unavailable = 50 if command == "STATUS" else 11
    path = _socket_path(config)
    try:
        reply = _exchange(path, request)
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        return _error(unavailable, f"podwire agent not reachable at {path}: {why} ({AGENT_HINT})")
    head, sep, body = reply.partition(b"\n")
    if not sep or not head.isdigit():
        return _error(unavailable, f"podwire agent at {path} sent no valid reply")
    sys.stdout.write(body.decode("utf-8", "replace"))
    return int(head)


if __name__ == "__main__":
    sys.exit(main())
