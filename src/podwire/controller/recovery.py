"""Rebuild the pools at start (or on taking over leadership) before any request is served.

Neutron is the truth about which ports exist, etcd about which are in use. The free pool ports
come from the ml2 forwarder's mirror in etcd when the forwarder vouches for it (``mirror``), else
from a few Neutron listings (ports of our owner, trunks, their networks and subnets); never one
call per port. Ports without a usable binding cannot be handed out and are deleted (leftovers
of a crash mid-create or of a dead node): before serving when Neutron was listed, otherwise by
``verify``, which lists Neutron once in the background after serving has started.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from podwire.controller.mirror import pools_from_mirror
from podwire.controller.nested import NestedDriver
from podwire.controller.neutron_ops import SUBPORT_OWNER, PortOps, delete_ports
from podwire.controller.pools import PoolKey
from podwire.controller.service import PoolService
from podwire.errors import ValidationError
from podwire.etcd.client import EtcdClient
from podwire.log import get_logger
from podwire.neutron.vifs import is_bound, port_to_vif
from podwire.schema.vif import DEVICE_OWNER, Vif

log = get_logger(__name__)

# Neutron's timestamps have whole seconds and come from another host's clock: a leftover must
# predate recovery by this much before ``verify`` deletes it.
LEFTOVER_MARGIN = 2.0


@dataclass
class RecoveryReport:
    source: str = "neutron"  # or "etcd": the forwarder's mirror, to be verified
    pooled: int = 0
    in_use: int = 0
    deleted: int = 0
    subports: int = 0
    started_at: float = 0.0
    verified: bool = False  # set once ``verify`` has listed Neutron
    mirrored: set[str] = field(default_factory=set, repr=False)
    networks: set[str] = field(default_factory=set, repr=False)

    def summary(self) -> dict[str, object]:
        hidden = ("mirrored", "networks", "verified")
        return {k: v for k, v in vars(self).items() if k not in hidden}


async def recover(
    service: PoolService,
    neutron: PortOps,
    nested: NestedDriver | None,
    etcd: EtcdClient | None = None,
) -> RecoveryReport:
    """``etcd``: where the forwarder's mirror is; without it, Neutron is always listed."""
    report = RecoveryReport(started_at=time.time())
    in_use = await service.adopt_in_use()
    report.in_use = len(in_use)
    subports = await _trunk_subports(neutron, nested) if nested is not None else {}
    mirrored = await pools_from_mirror(etcd, in_use) if etcd is not None else None
    ours: list[Any] | None = None  # compute:podwire ports, when Neutron was listed
    if mirrored is None:
        ours = await neutron.owned_ports(DEVICE_OWNER)
        taken = in_use | subports.keys()  # a subport is pooled on its trunk's node, below
        report.deleted = await _delete_leftovers(neutron, ours, taken)
        bound = [p for p in ours if is_bound(p) and str(p.id) not in taken]
        report.pooled = await _pool_ports(bound, service, neutron, _host_of, {})
    else:
        report.source = "etcd"
        report.mirrored = {vif.port_id for vifs in mirrored.values() for vif in vifs}
        report.networks = {key.network_id for key in mirrored}
        report.pooled = _fill(service, mirrored)
    if subports:
        report.subports = await _pool_subports(service, neutron, subports, in_use, ours)
    log.info("controller.recovered", **report.summary())
    return report


async def verify(service: PoolService, neutron: PortOps, report: RecoveryReport) -> None:
    """After recovering from the mirror: one Neutron listing to delete leftovers and drop
    pooled ports Neutron no longer has. Runs while requests are served, so a leftover must
    predate recovery: a port being created right now is unbound for a moment too. Also loads
    the pooled networks into the cache, so first requests make no Neutron call either."""
    await neutron.networks(report.networks)
    ports = await neutron.owned_ports(DEVICE_OWNER)
    older = [p for p in ports if _created_before(p, report.started_at)]
    known = {str(p.id) for p in older if service.knows(str(p.id))}  # pooled subports too
    deleted = await _delete_leftovers(neutron, older, known)
    listed = {str(p.id) for p in ports}
    vanished = {p: service.drop_free(p) for p in report.mirrored - listed}
    report.verified = True
    dropped = sorted(p for p, key in vanished.items() if key is not None)
    log.info("controller.recovery.verified", listed=len(ports), deleted=deleted, dropped=dropped)


def _created_before(port: Any, moment: float) -> bool:
    """Whether ``port`` surely predates ``moment``; unknown counts as new."""
    try:
        created = datetime.fromisoformat(str(port.created_at))
    except ValueError:
        return False
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)  # Neutron reports UTC
    return created.timestamp() < moment - LEFTOVER_MARGIN


async def _delete_leftovers(neutron: PortOps, ports: list[Any], in_use: Collection[str]) -> int:
    leftovers = [str(p.id) for p in ports if not is_bound(p) and str(p.id) not in in_use]
    await delete_ports(neutron, leftovers)
    return len(leftovers)


def _fill(service: PoolService, by_key: dict[PoolKey, list[Vif]]) -> int:
    for key, vifs in by_key.items():
        service.add_free(key, vifs)
    return sum(len(v) for v in by_key.values())


def _host_of(port: Any) -> str:
    return str(port.binding_host_id)


async def _pool_ports(
    ports: list[Any],
    service: PoolService,
    neutron: PortOps,
    node_of: Callable[[Any], str],
    vlans: dict[str, int],
) -> int:
    """Add ports to pools keyed by their host (or trunk node), project and network."""
    networks = await neutron.networks({str(p.network_id) for p in ports})
    by_key: defaultdict[PoolKey, list[Vif]] = defaultdict(list)
    for port in ports:
        network = networks.get(str(port.network_id))
        node = node_of(port)
        if network is None or not node:
            continue
        try:
            vif = port_to_vif(port, network, vlans.get(str(port.id)))
        except ValidationError as exc:
            log.warning("controller.recovery.skip_port", port=port.id, error=str(exc))
            continue
        by_key[PoolKey(node, str(port.project_id), network.id)].append(vif)
    return _fill(service, by_key)


@dataclass(frozen=True)
class _Subport:
    node: str  # the trunk's name
    vlan_id: int


async def _trunk_subports(neutron: PortOps, nested: NestedDriver) -> dict[str, _Subport]:
    """Subports of trunks named after nodes, by port id; their trunks and VLAN ids are
    re-learnt. Such a port is never a leftover, bound or not: binding it is the trunk driver's
    business (OVS binds it and owns it as ``trunk:subport``; others leave it as created)."""
    found: dict[str, _Subport] = {}
    for trunk in await neutron.list_trunks():
        nested.remember_trunk(str(trunk.name), str(trunk.id))
        subports = list(trunk.sub_ports or [])
        nested.vlans.mark(str(trunk.id), [int(s["segmentation_id"]) for s in subports])
        for sub in subports:
            found[str(sub["port_id"])] = _Subport(str(trunk.name), int(sub["segmentation_id"]))
    return found


async def _pool_subports(
    service: PoolService,
    neutron: PortOps,
    subports: dict[str, _Subport],
    in_use: set[str],
    ours: list[Any] | None,
) -> int:
    """Pool the free subports, whichever owner their trunk driver left them with; ``ours``:
    the ``compute:podwire`` ports if recovery listed them already."""
    if ours is None:
        ours = await neutron.owned_ports(DEVICE_OWNER)
    owned = await neutron.owned_ports(SUBPORT_OWNER)
    ports = [p for p in [*owned, *ours] if str(p.id) in subports and str(p.id) not in in_use]
    vlans = {port_id: sub.vlan_id for port_id, sub in subports.items()}
    return await _pool_ports(ports, service, neutron, lambda p: subports[str(p.id)].node, vlans)
