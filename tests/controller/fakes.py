"""Fakes of the controller's collaborators, for unit tests of recovery and recycling logic.

Only logic is tested with them: every behaviour they cover also has a real-stack test
(test_recovery.py, test_lifecycle.py, test_vif_api.py). The Neutron fake implements
``PortOps``, the few calls recovery, recycling and the sweeper make, and records every change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from podwire.config import PoolSettings
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.neutron_ops import PortOps
from podwire.controller.pool_admin import PoolAdmin
from podwire.controller.pool_service import PoolDeps, PoolService
from podwire.controller.vif_broker import VifBroker
from podwire.neutron.client import PortSummary
from podwire.neutron.vifs import NetworkInfo, Subnet
from podwire.schema.inuse import InUse, PoolKey
from podwire.schema.ports import FixedIp
from podwire.schema.vif import DEVICE_OWNER, Vif

NET = "0aaafa7a-e6be-4119-89f2-6070b63f72c6"
SUBNET = "5b1d5c0e-2f64-4d6e-9a53-2b7d1f1e0a01"
PROJECT = "p1"
NETWORK = NetworkInfo(
    NET, PROJECT, False, 1450, "vxlan", 1001, {SUBNET: Subnet(SUBNET, "10.1.0.0/24", "10.1.0.1")}
)
OLD = "2020-01-01T00:00:00"  # surely before any recovery started


def port(n: int, host: str = "n1", vif_type: str = "veth", **changes: Any) -> PortSummary:
    """Port ``n`` of ours on NET: bound to ``host`` unless ``host`` is empty."""
    summary = PortSummary(
        id=f"7d7c0f0e-1a2b-4c3d-8e9f-{n:012d}",
        network_id=NET,
        project_id=PROJECT,
        mac_address=f"fa:16:3e:00:00:{n:02x}",
        fixed_ips=[{"ip_address": f"10.1.0.{n + 10}", "subnet_id": SUBNET}],
        security_group_ids=[],
        binding_host_id=host,
        binding_vif_type=vif_type if host else "unbound",
        device_id="",
        created_at=OLD,
    )
    return replace(summary, **changes)


def vif_of(summary: PortSummary) -> Vif:
    ip = summary.fixed_ips[0]["ip_address"]
    return Vif(
        summary.id,
        NET,
        PROJECT,
        summary.mac_address,
        1450,
        [FixedIp(ip, SUBNET, "10.1.0.0/24", "10.1.0.1")],
        segmentation_id=1001,
    )


@dataclass
class FakeNeutron:
    """Neutron as a dict of ports; ``deleted`` and ``updates`` record what was asked."""

    ports: dict[str, PortSummary] = field(default_factory=dict)
    networks_known: dict[str, NetworkInfo] = field(default_factory=lambda: {NET: NETWORK})
    trunks: list[Any] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    updates: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    listed: list[set[str]] = field(default_factory=list)  # the ids of each list_ports call

    def add(self, *ports: PortSummary) -> None:
        self.ports.update({p.id: p for p in ports})

    async def networks(self, network_ids: Iterable[str]) -> dict[str, NetworkInfo]:
        return {n: self.networks_known[n] for n in network_ids if n in self.networks_known}

    async def update_port(self, port_id: str, **changes: Any) -> Any:
        self.updates.append((port_id, changes))
        if "security_group_ids" in changes:
            sgs = list(changes["security_group_ids"])
            self.ports[port_id] = replace(self.ports[port_id], security_group_ids=sgs)
        return self.ports[port_id]

    async def delete_port(self, port_id: str) -> None:
        self.deleted.append(port_id)
        self.ports.pop(port_id, None)

    async def list_ports(self, **filters: Any) -> list[Any]:
        wanted = set(filters.get("id", self.ports))
        self.listed.append(wanted)
        return [p for p in self.ports.values() if p.id in wanted]

    async def owned_ports(self, device_owner: str) -> list[PortSummary]:
        return [p for p in self.ports.values() if device_owner == DEVICE_OWNER]

    async def list_trunks(self, **filters: Any) -> list[Any]:
        return list(self.trunks)

    async def remove_subports(self, trunk_id: str, port_ids: list[str]) -> None:
        self.updates.append((trunk_id, {"removed_subports": list(port_ids)}))

    # PoolService's own request path (not PortOps): lookups from the cache
    async def network(self, name_or_id: str, project_id: str | None) -> NetworkInfo:
        return self.networks_known[name_or_id]

    async def check_security_groups(self, sgs: Iterable[str], project_id: str | None) -> None:
        return None


@dataclass
class FakeStore:
    records: dict[tuple[str, str], InUse] = field(default_factory=dict)

    async def load(self) -> tuple[list[InUse], int]:
        return list(self.records.values()), 1

    async def put(self, record: InUse) -> None:
        self.records[(record.node, record.attachment)] = record

    async def delete(self, node: str, attachment: str) -> None:
        self.records.pop((node, attachment), None)


@dataclass
class FakeDriver:
    """A pooled driver that deletes through the fake Neutron."""

    neutron: FakeNeutron
    pooled: bool = True

    async def delete(self, key: PoolKey, vifs: list[Vif]) -> None:
        for vif in vifs:
            await self.neutron.delete_port(vif.port_id)


@dataclass
class FakeDrivers:
    driver: FakeDriver
    forgotten: list[str] = field(default_factory=list)

    async def for_node(self, node: str) -> FakeDriver:
        return self.driver

    def forget(self, node: str) -> None:
        self.forgotten.append(node)


@dataclass
class FakeLiveness:
    alive: set[str] = field(default_factory=lambda: {"n1", "n2"})

    async def alive_nodes(self) -> set[str]:
        return set(self.alive)


@dataclass
class World:
    """A PoolService, its VIF broker and admin on fakes, with the fakes at hand."""

    service: PoolService
    broker: VifBroker
    admin: PoolAdmin
    neutron: FakeNeutron
    store: FakeStore
    drivers: FakeDrivers
    metrics: ControllerMetrics

    @property
    def ops(self) -> PortOps:
        return self.neutron

    def gauge(self, key: PoolKey) -> float | None:
        labels = {"node": key.node, "project": key.project_id, "network": key.network_id}
        return self.metrics.registry.get_sample_value("podwire_pool_ports", labels)


def world(settings: PoolSettings | None = None) -> World:
    neutron, store, metrics = FakeNeutron(), FakeStore(), ControllerMetrics()
    drivers = FakeDrivers(FakeDriver(neutron))
    deps = PoolDeps(
        settings or PoolSettings(),
        cast(Any, neutron),
        cast(Any, drivers),
        cast(Any, store),
        metrics,
        cast(Any, FakeLiveness()),
    )
    service = PoolService(deps)
    admin = PoolAdmin(service, deps)
    broker = VifBroker(service, admin, deps)
    return World(service, broker, admin, neutron, store, drivers, metrics)


def in_use(summary: PortSummary, attachment: str, node: str = "n1") -> InUse:
    return InUse(node, attachment, PoolKey(node, PROJECT, NET), vif_of(summary))
