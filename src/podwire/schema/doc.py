"""Decoding and encoding of the JSON documents podwire exchanges, bounded and versioned.

Every JSON value from outside — an etcd value, an HTTP body, a CNI config, the checkpoint —
is decoded here: the size is bounded before parsing, and nesting is bounded after (Python's
parser raises ``RecursionError`` on deep nesting, which no caller expects). Objects carry
``"v": 1``; readers accept unknown fields (writers may be upgraded first) and reject versions
they do not know.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from podwire.errors import ValidationError
from podwire.schema import fields

SCHEMA_VERSION = 1
T = TypeVar("T")

MAX_DEPTH = 32
MAX_VALUE = 1 << 20


def decode(raw: bytes | str, what: str, max_bytes: int = MAX_VALUE) -> Any:
    """Any JSON value, or ValidationError saying why not."""
    if len(raw) > max_bytes:
        raise fields.fail(what, f"larger than {max_bytes} bytes")
    try:
        value = json.loads(raw)
    except RecursionError as exc:
        raise fields.fail(what, f"nested deeper than {MAX_DEPTH} levels") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise fields.fail(what, f"not valid JSON: {exc}") from exc
    _check_depth(value, what)
    return value


def _check_depth(value: Any, what: str) -> None:
    level = [value]
    for _ in range(MAX_DEPTH + 1):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return
    raise fields.fail(what, f"nested deeper than {MAX_DEPTH} levels")


def as_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fields.fail(what, f"expected a JSON object, got {type(value).__name__}")
    return value


def closed_object(value: Any, what: str, allowed: frozenset[str]) -> dict[str, Any]:
    """A request body: unknown fields are refused (a typo must not be silently ignored)."""
    obj = as_object(value, what)
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ValidationError(f"{what}: unknown fields {', '.join(unknown)}")
    return obj


def decode_object(raw: bytes | str, what: str, max_bytes: int = MAX_VALUE) -> dict[str, Any]:
    return as_object(decode(raw, what, max_bytes), what)


def versioned(value: Any, what: str) -> dict[str, Any]:
    """An object carrying the schema version this reader understands."""
    obj = as_object(value, what)
    version = obj.get("v")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise fields.fail(what, f"unsupported schema version {version!r}")
    return obj


def decode_versioned(raw: bytes | str, what: str, max_bytes: int = MAX_VALUE) -> dict[str, Any]:
    return versioned(decode(raw, what, max_bytes), what)


class NewerVersion(ValidationError):
    """Written by a newer podwire: not damaged, but not this version's to read or overwrite."""


def decode_document(raw: bytes, what: str, max_bytes: int) -> dict[str, Any]:
    """A whole file podwire keeps (the agent's and the device plugin's checkpoints): one
    versioned object. Each way a file goes wrong gets its own message, since the operator
    decides from it whether to move the file away."""
    if len(raw) > max_bytes:
        raise fields.fail(what, f"larger than {max_bytes} bytes")
    if not raw.strip():
        raise fields.fail(what, "file is empty (truncated?)")
    try:
        value = decode(raw, what, max_bytes)
    except ValidationError as exc:
        raise ValidationError(f"{exc}; the file is truncated or damaged") from exc
    if not isinstance(value, dict):
        raise fields.fail(what, "top level must be a JSON object")
    version = value.get("v")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise NewerVersion(
            f"{what}: schema v={version} was written by a newer podwire; refusing to overwrite"
            " it (upgrade podwire or move the file away)"
        )
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise fields.fail(what, "missing or unknown schema version 'v'")
    return value


def encode(body: dict[str, Any]) -> bytes:
    """Canonical bytes: sorted keys make equal values byte-equal (no-op writes are skipped)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode_versioned(body: dict[str, Any]) -> bytes:
    return encode({"v": SCHEMA_VERSION, **body})


class Obj:
    """Typed access to one decoded object; every failure names the value and the field."""

    def __init__(self, value: dict[str, Any], what: str) -> None:
        self.value = value
        self.what = what

    def field(self, key: str) -> str:
        return f"{self.what}: {key}"

    def req(self, key: str, check: Callable[[Any, str], T]) -> T:
        item = self.value.get(key)
        if item is None:
            raise ValidationError(f"{self.what}: field {key!r} is required")
        return check(item, self.field(key))

    def opt(self, key: str, check: Callable[[Any, str], T], default: T) -> T:
        item = self.value.get(key)
        return default if item is None else check(item, self.field(key))

    def maybe(self, key: str, check: Callable[[Any, str], T]) -> T | None:
        item = self.value.get(key)
        return None if item is None else check(item, self.field(key))

    def obj(self, key: str) -> Obj | None:
        item = self.value.get(key)
        if item is None:
            return None
        return Obj(as_object(item, self.field(key)), self.field(key))
