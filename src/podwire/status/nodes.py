"""Node state as etcd holds it: the agents' keys under /podwire/state and desired ports."""

from __future__ import annotations

from dataclasses import dataclass, field

from podwire import keys
from podwire.errors import ValidationError
from podwire.etcd.client import EtcdClient, KeyValue
from podwire.schema import nodes
from podwire.schema.records import parse_leader


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
    # Security groups: ports enforced, the /podwire/global/ revision in force, problems logged;
    # None when the agent does not enforce (or predates enforcement).
    policy: nodes.PolicyState | None = None
    memif: list[nodes.MemifPortState] = field(default_factory=list)


def _apply_state(node: NodeStatus, kind: str, name: str | None, kv: KeyValue) -> None:
    try:
        if kind == "alive":
            node.version = nodes.parse_alive(kv.value, kv.key).version
            node.alive = True
        elif kind == "vtep":
            node.vtep = nodes.parse_vtep(kv.value, kv.key)
        elif kind == "capabilities":
            found = nodes.parse_capabilities(kv.value, kv.key).network_types
            node.network_types = sorted(found)
        elif kind == "physnets" and name:
            node.physnets[name] = nodes.parse_physnet(kv.value, kv.key)
        elif kind == "policy":
            node.policy = nodes.parse_policy_state(kv.value, kv.key)
        elif kind == "memif":
            node.memif = nodes.parse_memif_state(kv.value, kv.key)
        elif kind == "ports":
            nodes.parse_port_state(kv.value, kv.key)
            node.ports_wired += 1
    except ValidationError:
        node.bad_values += 1


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
    try:
        return parse_leader(kv.value, kv.key)
    except ValidationError as exc:
        return f"(unreadable: {exc})"
