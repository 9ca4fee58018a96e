"""What kube-node asks the apiserver, as the stack's admin: is its Node there and Ready.

Plain HTTPS with the admin's client cert (``kube_api.admin_context``): one GET, polled, needs
no client library.
"""

from __future__ import annotations

import datetime
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

NODE_PATH = "/api/v1/nodes/"


def get_node(url: str, context: ssl.SSLContext, name: str) -> dict[str, Any] | None:
    """The Node object, or None while it is not registered (or the apiserver does not answer)."""
    path = NODE_PATH + urllib.parse.quote(name, safe="")
    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=5, context=context) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _seconds(stamp: object) -> float:
    """An RFC 3339 time of the API (``2026-12-05T19:05:58Z``) as a POSIX time; 0 if none."""
    try:
        return datetime.datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return 0.0


def ready_condition(node: dict[str, Any] | None, since: float) -> tuple[bool, str]:
    """Whether the Node is Ready as reported by a kubelet started at ``since`` (a Node kept
    from an earlier run still shows that run's last status), and why not if not."""
    if node is None:
        return False, "not registered"
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") != "Ready":
            continue
        if _seconds(condition.get("lastHeartbeatTime")) < int(since):
            return False, "no status from this kubelet yet"
        return condition.get("status") == "True", str(condition.get("message", ""))
    return False, "no Ready condition yet"
