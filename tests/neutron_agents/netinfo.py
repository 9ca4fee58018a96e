"""What a namespace holds, read with iproute2 (``ip -j``), for the tests' assertions."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def links(ns: str) -> dict[str, dict[str, Any]]:
    """Every link of ``ns`` by name, as ``ip -j -d link`` shows it ({} if ``ns`` is gone)."""
    result = subprocess.run(
        ["ip", "-n", ns, "-j", "-d", "link", "show"], capture_output=True, text=True
    )
    if result.returncode != 0:
        return {}
    return {link["ifname"]: link for link in json.loads(result.stdout)}


def addresses(ns: str, device: str) -> set[str]:
    out = subprocess.run(
        ["ip", "-n", ns, "-j", "addr", "show", "dev", device], capture_output=True, text=True
    ).stdout
    return {
        f"{info['local']}/{info['prefixlen']}"
        for link in json.loads(out or "[]")
        for info in link.get("addr_info", [])
        if info.get("scope") == "global"
    }


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
    return {entry["name"] for entry in json.loads(out or "[]")}
