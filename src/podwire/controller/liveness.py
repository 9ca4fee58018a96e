"""Which nodes have a live agent: the ``alive`` heartbeat key, bound to the agent's lease, with
a beat its agent rewrites at each refresh of that lease.

Ports created for a node without a live agent cannot bind (ml2 declines such a host), so they
would only churn through Neutron: populate refuses such a node and background refills skip it.
A node found dead is logged once when it goes dead and once when it comes back, not on every
refill that skips it.
"""

from __future__ import annotations

import time

from podwire import keys
from podwire.controller.errors import NodeNotAlive, PhysnetNotServed
from podwire.errors import ValidationError
from podwire.etcd.client import EtcdClient
from podwire.log import get_logger
from podwire.schema.nodes import parse_alive

log = get_logger(__name__)


class Liveness:
    def __init__(self, etcd: EtcdClient) -> None:
        self._etcd = etcd
        self._dead: set[str] = set()  # nodes whose skipped refills were already logged

    async def alive(self, node: str) -> bool:
        kv = await self._etcd.get(keys.state_alive(node))
        if kv is None:
            return False
        return _beating(node, kv.value, kv.key, time.time())

    async def alive_nodes(self) -> set[str]:
        """Every node with a fresh heartbeat (one range read; the sweeper's view)."""
        items, _ = await self._etcd.get_prefix(keys.state_prefix())
        now, alive = time.time(), set()
        for kv in items:
            parsed = keys.parse_state_key(kv.key)
            if parsed is None or parsed[1] != "alive":
                continue
            if _beating(parsed[0], kv.value, kv.key, now):
                alive.add(parsed[0])
        return alive

    async def require(self, node: str) -> None:
        if not await self.alive(node):
            raise NodeNotAlive(no_agent(node))

    async def may_refill(self, node: str) -> bool:
        """Whether a background refill may create ports for ``node``; logs changes once."""
        alive = await self.alive(node)
        if not alive and node not in self._dead:
            self._dead.add(node)
            log.warning("pool.refill_skipped", node=node, reason=no_agent(node))
        elif alive and node in self._dead:
            self._dead.discard(node)
            log.info("pool.refill_resumed", node=node)
        return alive

    def noted_dead(self, node: str) -> bool:
        return node in self._dead

    async def require_physnet(self, node: str, network: str, physnet: str) -> None:
        """Refuses a flat or VLAN network whose physical network the node's agent does not map
        (ml2 would fail every binding of it there): one range read of its physnets."""
        items, _ = await self._etcd.get_prefix(keys.state_node_prefix(node) + "physnets/")
        served = set()
        for kv in items:
            parsed = keys.parse_state_key(kv.key)
            if parsed is not None and parsed[1] == "physnets" and parsed[2]:
                served.add(parsed[2])
        if physnet not in served:
            raise PhysnetNotServed(
                f"network {network} is on physical network {physnet!r}, which node {node} does"
                f" not serve (its agent maps {sorted(served) or 'none'}): add it to"
                " agent.physnet_mappings on that node or use another network"
            )


def _beating(node: str, raw: bytes, key: str, now: float) -> bool:
    """A heartbeat that parses and is fresh: a lease alone proves nothing (etcd lets any user
    refresh any lease), the beat only the node's own user can write does."""
    try:
        fresh = parse_alive(raw, key).fresh(now)
    except ValidationError as exc:
        log.warning("controller.node.bad_alive", node=node, error=str(exc))
        return False
    if not fresh:
        log.warning("controller.node.heartbeat_stale", node=node)
    return fresh


def no_agent(node: str) -> str:
    return (
        f"node {node} has no live agent (no {keys.state_alive(node)} key): "
        "ports for it could not bind; start its podwire agent first"
    )
