"""What podwire's tables hold, as a fingerprint that changes only when someone changes them.

The enforcer keeps the fingerprint of its tables as it left them and compares it with a fresh
listing at intervals: a table flushed, a rule or element deleted or added by hand or by another
tool is noticed and the whole ruleset is put back (Felix's read-back, for nftables). Handles
and counters change without anyone editing the ruleset (a replace renumbers, traffic counts),
so they are left out; a set's elements are compared as a set, whatever order the kernel lists
them in.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from podwire.errors import PermanentError
from podwire.netfilter import Nftables, NftError
from podwire.sgpolicy.ruleset import FAMILIES, TABLE


class ReadBackError(PermanentError):
    """The kernel's listing of podwire's tables could not be read."""


async def fingerprint(nft: Nftables) -> str:
    """One digest of podwire's tables in every family ("absent" for a missing table)."""
    parts = [await _listing(nft, family) for family in FAMILIES]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


async def _listing(nft: Nftables, family: str) -> Any:
    try:
        text = await nft.query(f"list table {family} {TABLE}")
    except NftError as exc:
        if "No such file or directory" in str(exc):
            return "absent"
        raise
    try:
        items = json.loads(text)["nftables"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ReadBackError(f"nft listing of {family} {TABLE}: {exc}") from exc
    return [_stable(item) for item in items if "metainfo" not in item]


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _field(key, item) for key, item in value.items() if key != "handle"}
    if isinstance(value, list):
        return [_stable(item) for item in value]
    return value


def _field(key: str, item: Any) -> Any:
    if key == "counter":
        return {}
    if key == "elem" and isinstance(item, list):  # listed in hash order, which a resize changes
        return sorted((_stable(element) for element in item), key=json.dumps)
    return _stable(item)
