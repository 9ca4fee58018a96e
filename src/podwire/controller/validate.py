"""The admin API's own body fields (node lists, counts, security-group sets); every error
names the field.

Every other field of the API is read with ``podwire.schema.fields``' rules directly, and the
VIF request body is the schema's own ``VifRequest``.
"""

from __future__ import annotations

from typing import Any

from podwire.errors import ValidationError
from podwire.schema import fields, vif

MAX_POPULATE = 500
MAX_NODES = 100


def security_group_set(value: Any) -> tuple[str, ...]:
    return tuple(sorted(set(vif.security_groups(value, "security_groups"))))


def nodes(value: Any) -> list[str]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_NODES:
        raise ValidationError(f"nodes: expected a list of 1 to {MAX_NODES} node names")
    return [fields.name(node, "nodes[]") for node in value]


def count(value: Any) -> int:
    return fields.integer(value, "count", 1, MAX_POPULATE)
