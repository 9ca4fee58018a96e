"""Strict parsing of API bodies: every field checked, every error names the field."""

from __future__ import annotations

import re
from typing import Any

from podwire import keys
from podwire.controller.pools import sg_key
from podwire.controller.service import VifRequest
from podwire.errors import ValidationError

MAX_POPULATE = 500
MAX_NODES = 100
MAX_SGS = 20
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$")
_ID = re.compile(r"^[0-9a-fA-F-]{1,64}$")


def segment(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what}: expected a string")
    try:
        return keys.check_segment(value, what)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc


def object_body(raw: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValidationError("body: expected a JSON object")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValidationError(f"body: unknown fields {', '.join(unknown)}")
    return raw


def ref(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _REF.match(value):
        raise ValidationError(f"{what}: expected a Neutron id or name")
    return value


def ident(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise ValidationError(f"{what}: {value!r} is not a Neutron id")
    return value


def optional_ident(value: Any, what: str) -> str | None:
    return None if value is None else ident(value, what)


def security_groups(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_SGS:
        raise ValidationError(f"security_groups: expected a list of at most {MAX_SGS} ids")
    return sg_key(ident(sg, "security_groups[]") for sg in value)


def vif_request(raw: Any) -> VifRequest:
    body = object_body(raw, {"attachment", "network", "project_id", "security_groups", "pod"})
    pod = body.get("pod") or {}
    if not isinstance(pod, dict):
        raise ValidationError("pod: expected an object")
    if "attachment" not in body or "network" not in body:
        raise ValidationError("body: attachment and network are required")
    return VifRequest(
        attachment=segment(body["attachment"], "attachment"),
        network=ref(body["network"], "network"),
        project_id=optional_ident(body.get("project_id"), "project_id"),
        security_groups=security_groups(body.get("security_groups")),
        pod_name=_short(pod.get("name", ""), "pod.name"),
        pod_uid=_short(pod.get("uid", ""), "pod.uid"),
    )


def _short(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > 253:
        raise ValidationError(f"{what}: expected a string of at most 253 characters")
    return value


def nodes(value: Any) -> list[str]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_NODES:
        raise ValidationError(f"nodes: expected a list of 1 to {MAX_NODES} node names")
    return [segment(node, "nodes[]") for node in value]


def count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_POPULATE:
        raise ValidationError(f"count: expected an integer from 1 to {MAX_POPULATE}")
    return value
