"""Nested mode: pod ports are subports on the trunk of the node's VM, one VLAN id each.

VLAN ids are a per-trunk resource; an id must go back to the allocator on every path where
its subport does not end up on the trunk, or the trunk slowly runs out of ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podwire.controller.drivers import port_bodies
from podwire.controller.errors import (
    PoolNotReady,
    TrunkAmbiguous,
    TrunkNotAllowed,
    UnknownTrunk,
)
from podwire.controller.neutron_ops import NeutronOps, delete_ports
from podwire.errors import PodwireError
from podwire.log import get_logger
from podwire.neutron.client import NeutronNotFound
from podwire.neutron.vifs import NetworkInfo, port_to_vif
from podwire.schema.inuse import PoolKey, SgKey
from podwire.schema.vif import Vif

log = get_logger(__name__)

VLAN_MIN, VLAN_MAX = 1, 4094


class VlanAllocator:
    """Free VLAN ids per trunk, lowest first."""

    def __init__(self) -> None:
        self._used: dict[str, set[int]] = {}

    def allocate(self, trunk_id: str, count: int) -> list[int]:
        used = self._used.setdefault(trunk_id, set())
        free = [v for v in range(VLAN_MIN, VLAN_MAX + 1) if v not in used][:count]
        if len(free) < count:
            raise PoolNotReady(f"trunk {trunk_id} has only {len(free)} free VLAN ids")
        used.update(free)
        return free

    def mark(self, trunk_id: str, vlan_ids: list[int]) -> None:
        self._used.setdefault(trunk_id, set()).update(vlan_ids)

    def release(self, trunk_id: str, vlan_ids: list[int]) -> None:
        self._used.get(trunk_id, set()).difference_update(vlan_ids)

    def in_use(self, trunk_id: str) -> set[int]:
        return set(self._used.get(trunk_id, set()))

    def clear(self) -> None:
        """Before a new leader term re-learns every trunk's VLAN ids from Neutron."""
        self._used.clear()


@dataclass(frozen=True)
class NodeTrunk:
    """Whose trunk it is: the node whose pods it carries and the project it belongs to."""

    node: str
    project_id: str


class NestedDriver:
    """Subports created in bulk, then added to the node's trunk in one call.

    A trunk's VM receives the traffic of every subport, so a trunk is used only for pools of
    its own project: the node's trunk is the one ``pool.nested_trunks`` gives by id, else the
    one named after the node in the pool's project (never searched across projects), and is
    refused when it belongs to another project.
    """

    name = "nested"
    pooled = True

    def __init__(
        self,
        neutron: NeutronOps,
        port_debug: bool,
        vlans: VlanAllocator,
        configured: Mapping[str, str] | None = None,
    ) -> None:
        """``configured``: ``pool.nested_trunks``, node -> trunk id."""
        self._neutron = neutron
        self._port_debug = port_debug
        self.vlans = vlans
        self._configured = dict(configured or {})
        self._nodes_of = {trunk: node for node, trunk in self._configured.items()}
        self._trunks: dict[tuple[str, str], str] = {}  # (node, project) -> trunk id

    def node_of(self, trunk_id: str, trunk_name: str) -> str | None:
        """The node a trunk serves: the one configured with its id, else the one it is named
        after, unless that node is configured with another trunk."""
        node = self._nodes_of.get(trunk_id)
        if node is not None:
            return node
        return None if trunk_name in self._configured else trunk_name

    def remember_trunk(self, owner: NodeTrunk, trunk_id: str) -> None:
        """A trunk recovery found for ``owner`` (it checked the trunk's project)."""
        self._trunks[(owner.node, owner.project_id)] = trunk_id

    def forget_trunks(self) -> None:
        """Before a new leader term learns the trunks again from Neutron."""
        self._trunks.clear()

    async def trunk_for(self, node: str, project_id: str) -> str:
        """The trunk that carries ``node``'s pods of ``project_id`` (looked up once).

        Raises UnknownTrunk, TrunkAmbiguous or TrunkNotAllowed (another project's trunk)."""
        trunk_id = self._trunks.get((node, project_id))
        if trunk_id is None:
            configured = self._configured.get(node)
            if configured is not None:
                trunk = await self._configured_trunk(node, configured)
            else:
                trunk = await self._named_trunk(node, project_id)
            check_trunk_project(trunk, node, project_id)
            trunk_id = self._trunks[(node, project_id)] = str(trunk.id)
        return trunk_id

    async def _configured_trunk(self, node: str, trunk_id: str) -> Any:
        try:
            return await self._neutron.get_trunk(trunk_id)
        except NeutronNotFound as exc:
            raise UnknownTrunk(
                f"node {node!r} is nested on trunk {trunk_id} (pool.nested_trunks), which"
                " Neutron does not have: fix pool.nested_trunks"
            ) from exc

    async def _named_trunk(self, node: str, project_id: str) -> Any:
        if not project_id:  # an empty filter would be no filter: every project's trunks
            raise UnknownTrunk(f"node {node!r} is nested, but its pool names no project")
        found = await self._neutron.list_trunks(name=node, project_id=project_id)
        if not found:
            raise UnknownTrunk(
                f"node {node!r} is nested but project {project_id} (the pool's) has no trunk"
                f" named {node!r}: create the node's trunk in that project or give its id in"
                " pool.nested_trunks (a trunk of another project is never used)"
            )
        if len(found) > 1:
            ids = ", ".join(sorted(str(t.id) for t in found))
            raise TrunkAmbiguous(
                f"node {node!r} is nested and {len(found)} trunks of project {project_id}"
                f" are named {node!r} ({ids}): give the node's trunk id in pool.nested_trunks"
            )
        return found[0]

    async def create(self, key: PoolKey, sgs: SgKey, count: int, network: NetworkInfo) -> list[Vif]:
        trunk_id = await self.trunk_for(key.node, key.project_id)
        vlan_ids = self.vlans.allocate(trunk_id, count)
        ports: list[Any] = []
        try:
            bodies = port_bodies(key, sgs, count, self._port_debug, host=False)
            ports = await self._neutron.create_ports(bodies)
            subports = [
                {"port_id": p.id, "segmentation_type": "vlan", "segmentation_id": v}
                for p, v in zip(ports, vlan_ids, strict=True)
            ]
            await self._neutron.add_subports(trunk_id, subports)
        except BaseException:
            self.vlans.release(trunk_id, vlan_ids)
            await self._discard(ports)
            raise
        return [port_to_vif(p, network, v) for p, v in zip(ports, vlan_ids, strict=True)]

    async def _discard(self, ports: list[Any]) -> None:
        with contextlib.suppress(PodwireError):
            await delete_ports(self._neutron, [str(p.id) for p in ports])
        if ports:
            log.warning("controller.nested.create_rolled_back", ports=len(ports))

    async def delete(self, key: PoolKey, vifs: list[Vif]) -> None:
        if not vifs:
            return
        trunk_id = await self.trunk_for(key.node, key.project_id)
        port_ids = [v.port_id for v in vifs]
        await self._neutron.remove_subports(trunk_id, port_ids)
        self.vlans.release(trunk_id, [v.vlan_id for v in vifs if v.vlan_id is not None])
        await delete_ports(self._neutron, port_ids)


def check_trunk_project(trunk: Any, node: str, project_id: str) -> None:
    """Refuses another project's trunk: its VM would receive the pool project's traffic."""
    owner = str(trunk.project_id or "")
    if owner != project_id:
        raise TrunkNotAllowed(
            f"node {node!r}: trunk {trunk.id} belongs to project {owner or '(none)'}, not to"
            f" project {project_id} whose ports the node asked for: no subport is added to"
            " another project's trunk (create the node's trunk in the pool's project, or fix"
            " pool.nested_trunks)"
        )
