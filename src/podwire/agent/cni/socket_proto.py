"""The plugin <-> agent protocol on the unix socket (both plugin builds speak it).

Request: one JSON object ``{"env": {"CNI_COMMAND": ..., ...}, "stdin": "<config>"}``, then the
client shuts down its write side. Reply: the exit code in decimal, a newline, then the bytes
the plugin prints on stdout. The reply format is that simple so the C plugin needs no JSON
parser: it is a pipe, not a second implementation of CNI.
"""

from __future__ import annotations

from podwire.agent.cni.request import MAX_CONFIG, MAX_CONFIG_EXTRA
from podwire.cni.spec import DECODE_FAILURE, CniError
from podwire.errors import ValidationError
from podwire.schema import doc

# Any config the plugins pass (at most MAX_CONFIG + MAX_CONFIG_EXTRA bytes) must fit after JSON
# escaping, which is at worst 6 bytes per byte (a control byte as \u00XX), plus the CNI_*
# environment (each value at most 128 KiB on Linux, escaped the same way): the request's limit
# must never be what refuses a config the agent would accept.
ENV_KEYS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
MAX_ENV_VALUE = 128 << 10  # Linux's MAX_ARG_STRLEN
MAX_REQUEST = 6 * (MAX_CONFIG + MAX_CONFIG_EXTRA + len(ENV_KEYS) * MAX_ENV_VALUE) + 4096


def decode_request(data: bytes) -> tuple[dict[str, str], str]:
    try:
        body = doc.decode_object(data, "request to the podwire agent", MAX_REQUEST)
    except ValidationError as exc:
        raise CniError(DECODE_FAILURE, str(exc)) from exc
    env, stdin = body.get("env"), body.get("stdin", "")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise CniError(DECODE_FAILURE, "request 'env' must be an object of strings")
    if not isinstance(stdin, str):
        raise CniError(DECODE_FAILURE, "request 'stdin' must be a string")
    return {k: v for k, v in env.items() if k in ENV_KEYS}, stdin


def encode_reply(code: int, stdout: str) -> bytes:
    return f"{code}\n".encode() + stdout.encode()
