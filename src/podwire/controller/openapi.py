"""The OpenAPI 3.0 document served at ``/openapi.json`` (kept next to the routes it describes)."""

from __future__ import annotations

from typing import Any

_ERR = {"$ref": "#/components/schemas/Error"}


def _resp(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"description": description}
    if schema is not None:
        body["content"] = {"application/json": {"schema": schema}}
    return body


_ERRORS = {
    "400": _resp("malformed body or names", _ERR),
    "401": _resp("missing or unknown token (or one with non-ASCII characters)", _ERR),
    "403": _resp(
        "token of another node; network, security group or (nested) the node's trunk of"
        " another project",
        _ERR,
    ),
    "404": _resp(
        "unknown network, project or security group; (nested) no trunk of the node's", _ERR
    ),
    "409": _resp(
        "no port can work: network name ambiguous, network down or without subnet, subnet"
        " full, physnet not served, node without a live agent, (nested) several trunks of"
        " the node's name",
        _ERR,
    ),
    "413": _resp("body over 64 KiB", _ERR),
    "503": _resp("not ready; retry (Retry-After header)", _ERR),
}
_NODE = {"name": "node", "in": "path", "required": True, "schema": {"type": "string"}}


def _op(summary: str, ok: dict[str, Any], body: str | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**ok, **_ERRORS}}
    if body:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
        }
    return op


def document(version: str) -> dict[str, Any]:
    ids = {"type": "array", "items": {"type": "string"}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "podwire controller", "version": version},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {"type": "string"},
                        "retryable": {"type": "boolean"},
                        "cause": {"type": "string"},
                    },
                },
                "VifRequest": {
                    "type": "object",
                    "required": ["attachment", "network"],
                    "properties": {
                        "attachment": {"type": "string"},
                        "network": {"type": "string"},
                        "project_id": {"type": "string", "nullable": True},
                        "security_groups": ids,
                        "pod": {"type": "object"},
                        "replaces": {"type": "string"},
                    },
                },
                "Populate": {
                    "type": "object",
                    "required": ["nodes", "network", "count"],
                    "properties": {
                        "nodes": ids,
                        "network": {"type": "string"},
                        "project_id": {"type": "string", "nullable": True},
                        "security_groups": ids,
                        "count": {"type": "integer", "minimum": 1, "maximum": 500},
                    },
                },
                "Free": {"type": "object", "required": ["nodes"], "properties": {"nodes": ids}},
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/nodes/{node}/vifs": {
                "parameters": [_NODE],
                "post": _op(
                    "Get a VIF for an attachment (node token)", {"200": _resp("VIF")}, "VifRequest"
                ),
                "get": _op("Attachments of the node", {"200": _resp("attachments")}),
            },
            "/v1/nodes/{node}/vifs/{attachment}": {
                "parameters": [
                    _NODE,
                    {
                        "name": "attachment",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                ],
                "delete": _op("Release an attachment's VIF (idempotent)", {"204": _resp("gone")}),
            },
            "/v1/pools": {"get": _op("List pools (admin)", {"200": _resp("pools")})},
            "/v1/pools/{node}/{project_id}/{network_id}": {
                "get": _op("Show one pool by its key (admin)", {"200": _resp("pool")}),
            },
            "/v1/pools/populate": {
                "post": _op(
                    "Create N ports in the pools of nodes (admin)",
                    {
                        "200": _resp("created per node (ports whose binding succeeded)"),
                        "409": _resp(
                            "a node has no live agent or keeps no pool, ml2 bound none of a"
                            " node's ports, the subnet is full"
                        ),
                    },
                    "Populate",
                ),
            },
            "/v1/pools/free": {
                "post": _op("Free the pools of nodes (admin)", {"200": _resp("freed")}, "Free"),
            },
            "/v1/nodes/{node}": {
                "parameters": [_NODE],
                "delete": _op(
                    "Release everything a removed node held: in-use ports deleted, records"
                    " dropped, pools freed (admin)",
                    {"200": _resp("the node and the in-use ports deleted")},
                ),
            },
            "/v1/networks/{network_id}/pools": {
                "delete": _op("Delete a network's pools (admin)", {"200": _resp("freed")}),
            },
            "/v1/security-groups/{sg_id}/pools": {
                "delete": _op("Remove an SG from pools (admin)", {"200": _resp("moved")}),
            },
        },
    }
