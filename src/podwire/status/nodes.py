"""Node state as etcd holds it: the agents' keys under /podwire/state and desired ports."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from podwire import keys
from podwire.etcd.client import EtcdClient, KeyValue


@dataclass
class NodeStatus:
    host: str
    alive: bool = False
    version: str = ""
    vtep: str = ""
    physnets: dict[str, str] = field(default_factory=dict)
    network_types: list[str] = field(default_factory=list)
    ports_desired: int = 0
    ports_wired: int = 0
    bad_values: int = 0


def _json(kv: KeyValue) -> dict[str, Any] | None:
    try:
        value = json.loads(kv.value)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get("v") == 1 else None


def _apply_state(node: NodeStatus, kind: str, name: str | None, kv: KeyValue) -> None:
    value = _json(kv)
    if value is None:
        node.bad_values += 1
        return
    if kind == "alive":
        node.alive = True
        node.version = str(value.get("version", ""))
    elif kind == "vtep":
        node.vtep = str(value.get("ip", ""))
    elif kind == "capabilities":
        node.network_types = [str(t) for t in value.get("network_types", [])]
    elif kind == "physnets" and name:
        node.physnets[name] = str(value.get("interface", ""))
    elif kind == "ports":
        node.ports_wired += 1


async def collect_nodes(etcd: EtcdClient) -> list[NodeStatus]:
    nodes: dict[str, NodeStatus] = {}
    state, _ = await etcd.get_prefix(keys.state_prefix() + "nodes/")
    for kv in state:
        parsed = keys.parse_state_key(kv.key)
        if parsed is not None:
            host, kind, name = parsed
            _apply_state(nodes.setdefault(host, NodeStatus(host)), kind, name, kv)
    desired, _ = await etcd.get_prefix(keys.nodes_prefix())
    for kv in desired:
        host = kv.key[len(keys.nodes_prefix()) :].split("/", 1)[0]
        nodes.setdefault(host, NodeStatus(host)).ports_desired += 1
    return sorted(nodes.values(), key=lambda node: node.host)


async def collect_leaders(etcd: EtcdClient, names: tuple[str, ...]) -> dict[str, str | None]:
    """Who holds each election key (its value names the holder), or None when nobody does."""
    leaders: dict[str, str | None] = {}
    for name in names:
        kv = await etcd.get(keys.election(name))
        leaders[name] = None if kv is None else _holder(kv)
    return leaders


def _holder(kv: KeyValue) -> str:
    """The forwarder stores its identity as text, the controller as ``{"identity": ...}``."""
    value = _json(kv)
    if value is not None and "identity" in value:
        return str(value["identity"])
    return kv.value.decode(errors="replace")
