"""``podwire pools ...`` and ``podwire nodes remove``: the controller's admin API from a shell."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from podwire.errors import PermanentError, RetryableError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("pools", help="inspect and manage the controller's pools")
    _admin_flags(parser)
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list")
    show = actions.add_parser("show")
    for name in ("node", "project_id", "network_id"):
        show.add_argument(name)
    populate = actions.add_parser("populate")
    populate.add_argument("--node", action="append", required=True)
    populate.add_argument("--network", required=True)
    populate.add_argument("--project-id")
    populate.add_argument("--security-group", action="append", default=[])
    populate.add_argument("--count", type=int, required=True)
    free = actions.add_parser("free")
    free.add_argument("--node", action="append", required=True)
    parser.set_defaults(handler=run)
    nodes = subparsers.add_parser("nodes", help="release what nodes removed from the cluster held")
    node_actions = nodes.add_subparsers(dest="action", required=True)
    remove = node_actions.add_parser(
        "remove", help="delete the node's in-use ports, drop their records, free its pools"
    )
    remove.add_argument("node")
    _admin_flags(remove)
    nodes.set_defaults(handler=run)


def _admin_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=os.environ.get("PODWIRE_CONTROLLER_URL", "http://127.0.0.1:7070")
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("PODWIRE_ADMIN_TOKEN", ""),
        help="admin token (or PODWIRE_ADMIN_TOKEN)",
    )


def run(args: argparse.Namespace) -> int:
    method, path, body = _request_for(args)
    result = call(args.url, args.token, method, path, body)
    json.dump(result, sys.stdout, indent=2, sort_keys=True)
    print()
    return 0


def _request_for(args: argparse.Namespace) -> tuple[str, str, Any]:
    if args.action == "remove":
        return "DELETE", f"/v1/nodes/{urllib.parse.quote(args.node, safe='')}", None
    if args.action == "list":
        return "GET", "/v1/pools", None
    if args.action == "show":
        return "GET", f"/v1/pools/{args.node}/{args.project_id}/{args.network_id}", None
    if args.action == "populate":
        body = {
            "nodes": args.node,
            "network": args.network,
            "project_id": args.project_id,
            "security_groups": args.security_group,
            "count": args.count,
        }
        return "POST", "/v1/pools/populate", body
    return "POST", "/v1/pools/free", {"nodes": args.node}


def call(url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    """One admin API call; the controller's error message becomes the exception message."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        message = _error_text(exc)
        if exc.code >= 500:
            raise RetryableError(f"controller: HTTP {exc.code}: {message}") from exc
        raise PermanentError(f"controller: HTTP {exc.code}: {message}") from exc
    except OSError as exc:
        raise RetryableError(f"controller at {url} unreachable: {exc}") from exc


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"])
    except (ValueError, KeyError, TypeError):
        return exc.reason or "error"
