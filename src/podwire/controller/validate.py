"""Strict parsing of the admin API's bodies and path names; every error names the field.

Field rules come from ``podwire.schema.fields``; the VIF request body is the schema's own
``VifRequest``.
"""

from __future__ import annotations

from typing import Any

from podwire.errors import ValidationError
from podwire.schema import doc, fields
from podwire.schema.vif import security_groups as sg_list

MAX_POPULATE = 500
MAX_NODES = 100


def segment(value: Any, what: str) -> str:
    return fields.name(value, what)


def object_body(raw: Any, allowed: set[str]) -> dict[str, Any]:
    return doc.closed_object(raw, "body", frozenset(allowed))


def ref(value: Any, what: str) -> str:
    return fields.neutron_ref(value, what)


def ident(value: Any, what: str) -> str:
    return fields.neutron_id(value, what)


def optional_ident(value: Any, what: str) -> str | None:
    return fields.optional(value, what, fields.neutron_id)


def security_groups(value: Any) -> tuple[str, ...]:
    return tuple(sorted(set(sg_list(value, "security_groups"))))


def nodes(value: Any) -> list[str]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_NODES:
        raise ValidationError(f"nodes: expected a list of 1 to {MAX_NODES} node names")
    return [fields.name(node, "nodes[]") for node in value]


def count(value: Any) -> int:
    return fields.integer(value, "count", 1, MAX_POPULATE)
