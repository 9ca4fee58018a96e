"""kubelet's netfilter chains in the host's namespace, removed when the node stops.

kubelet adds ``KUBE-FIREWALL`` (a rule against martian loopback traffic, jumped to from
INPUT and OUTPUT), ``KUBE-KUBELET-CANARY`` and ``KUBE-IPTABLES-HINT`` through iptables-nft,
which creates the ``ip``/``ip6`` tables ``mangle``, ``filter`` and ``nat`` that hold them.
None of it goes when kubelet stops: the node removes the jumps and the chains, and each of those
tables that was not there before kubelet started and holds no rule any more.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from podwire.errors import KubeError

Table = tuple[str, str]  # (family, name)
KUBELET_TABLES = frozenset(
    (family, name) for family in ("ip", "ip6") for name in ("mangle", "filter", "nat")
)
CHAIN_PREFIX = "KUBE-"


def _nft(netns: str, *args: str) -> str:
    command = ["nsenter", f"--net=/run/netns/{netns}", "--", "nft", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KubeError(f"nft {' '.join(args)} in {netns}: {done.stderr.strip()}")
    return done.stdout


def _items(netns: str, *args: str) -> list[dict[str, Any]]:
    listed = json.loads(_nft(netns, "-j", "list", *args) or "{}")
    return [item for item in listed.get("nftables", []) if "metainfo" not in item]


def tables(netns: str) -> set[Table]:
    found = (item["table"] for item in _items(netns, "tables"))
    return {(str(table["family"]), str(table["name"])) for table in found}


def _jumps_to_kubelet(rule: dict[str, Any]) -> bool:
    for expr in rule.get("expr", []):
        for verdict in ("jump", "goto"):
            if str(expr.get(verdict, {}).get("target", "")).startswith(CHAIN_PREFIX):
                return True
    return False


def _clean_table(netns: str, table: Table) -> None:
    items = _items(netns, "table", *table)
    rules = [item["rule"] for item in items if "rule" in item]
    chains = [item["chain"]["name"] for item in items if "chain" in item]
    for rule in rules:
        if _jumps_to_kubelet(rule) and not rule["chain"].startswith(CHAIN_PREFIX):
            _nft(netns, "delete", "rule", *table, rule["chain"], "handle", str(rule["handle"]))
    ours = [chain for chain in chains if chain.startswith(CHAIN_PREFIX)]
    for chain in ours:
        _nft(netns, "flush", "chain", *table, chain)
    for chain in ours:
        _nft(netns, "delete", "chain", *table, chain)


def remove_kubelet_chains(netns: str, before: set[Table]) -> None:
    """kubelet's chains, the rules jumping to them, and the tables only kubelet made."""
    for table in sorted(tables(netns) & KUBELET_TABLES):
        _clean_table(netns, table)
        if table not in before and not any("rule" in i for i in _items(netns, "table", *table)):
            _nft(netns, "delete", "table", *table)
