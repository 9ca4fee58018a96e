#!/usr/bin/env python3
"""podwire's CNI plugin, stdlib-only fallback of the C build (same behaviour, same tests).

A pipe: it forwards the CNI environment and the network config to the podwire agent's unix
socket and prints the agent's reply with the agent's exit code. It answers VERSION itself and,
when the agent cannot be reached, prints a CNI error itself: 50 for STATUS, 11 otherwise.
Installed as a script, so it must not import anything outside the standard library.
"""

import json
import os
import socket
import sys

SUPPORTED = ["0.4.0", "1.0.0", "1.1.0"]
DEFAULT_SOCKET = "/run/podwire/agent.sock"
ENV_KEYS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
TIMEOUT = 300.0


def _error(code: int, msg: str) -> int:
    sys.stdout.write(json.dumps({"cniVersion": "1.1.0", "code": code, "msg": msg}))
    return code


def _socket_path(config: str) -> str:
    try:
        value = json.loads(config).get("agentSocket")
    except (ValueError, AttributeError):
        value = None
    if isinstance(value, str) and value:
        return value
    # A config too broken to name its socket still reaches the agent, which explains the error.
    return os.environ.get("PODWIRE_CNI_SOCKET") or DEFAULT_SOCKET


def _exchange(path: str, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(path)
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        chunks: list[bytes] = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def main() -> int:
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        sys.stdout.write(json.dumps({"cniVersion": "1.1.0", "supportedVersions": SUPPORTED}))
        return 0
    config = sys.stdin.read()
    env = {key: os.environ[key] for key in ENV_KEYS if key in os.environ}
    request = json.dumps({"env": env, "stdin": config}).encode()
    unavailable = 50 if command == "STATUS" else 11
    path = _socket_path(config)
    try:
        reply = _exchange(path, request)
    except OSError as exc:
        return _error(unavailable, f"podwire agent not reachable at {path}: {exc}")
    head, sep, body = reply.partition(b"\n")
    if not sep or not head.isdigit():
        return _error(unavailable, f"podwire agent at {path} sent no valid reply")
    sys.stdout.write(body.decode("utf-8", "replace"))
    return int(head)


if __name__ == "__main__":
    sys.exit(main())
