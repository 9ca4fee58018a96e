"""Nested mode: pod ports are subports on the trunk of the node's VM, one VLAN id each.

VLAN ids are a per-trunk resource; an id must go back to the allocator on every path where
its subport does not end up on the trunk, or the trunk slowly runs out of ids.
"""

from __future__ import annotations

import contextlib
from typing import Any

from podwire.controller.drivers import port_bodies
from podwire.controller.errors import PoolNotReady, UnknownResource
from podwire.controller.neutron_ops import NeutronOps, delete_ports
from podwire.controller.pools import PoolKey, SgKey
from podwire.errors import PodwireError
from podwire.log import get_logger
from podwire.neutron.vifs import NetworkInfo, port_to_vif
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


class NestedDriver:
    """Subports created in bulk, then added to the node's trunk in one call."""

    name = "nested"
    pooled = True

    def __init__(self, neutron: NeutronOps, port_debug: bool, vlans: VlanAllocator) -> None:
        self._neutron = neutron
        self._port_debug = port_debug
        self.vlans = vlans
        self._trunks: dict[str, str] = {}

    def remember_trunk(self, node: str, trunk_id: str) -> None:
        self._trunks[node] = trunk_id

    async def trunk_for(self, node: str) -> str:
        """The node's trunk is the one named after the node (looked up once)."""
        trunk_id = self._trunks.get(node)
        if trunk_id is None:
            trunk = await self._neutron.find_trunk(node)
            if trunk is None:
                raise UnknownResource(f"node {node!r} is nested but has no trunk named {node!r}")
            trunk_id = self._trunks[node] = str(trunk.id)
        return trunk_id

    async def create(self, key: PoolKey, sgs: SgKey, count: int, network: NetworkInfo) -> list[Vif]:
        trunk_id = await self.trunk_for(key.node)
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
        trunk_id = await self.trunk_for(key.node)
        port_ids = [v.port_id for v in vifs]
        await self._neutron.remove_subports(trunk_id, port_ids)
        self.vlans.release(trunk_id, [v.vlan_id for v in vifs if v.vlan_id is not None])
        await delete_ports(self._neutron, port_ids)
