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
from podwire.controller.nested import NestedDriver, NodeTrunk
from podwire.controller.neutron_ops import SUBPORT_OWNER, PortOps, delete_ports
from podwire.controller.pool_service import PoolService
from podwire.errors import PodwireError, ValidationError
from podwire.etcd.client import EtcdClient
from podwire.log import get_logger
from podwire.neutron.vifs import is_bound, port_to_vif
from podwire.schema.inuse import PoolKey
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
    trunked: set[str] = field(default_factory=set, repr=False)  # every trunk's subports

    def summary(self) -> dict[str, object]:
        hidden = ("mirrored", "networks", "verified", "trunked")
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
    report.trunked = set(subports)
    if subports and nested is not None:
        report.subports = await _pool_subports(service, neutron, nested, subports, in_use, ours)
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
    # Pooled subports are known; a subport left on a trunk it must not be on is no leftover
    # either (Neutron refuses to delete a subport).
    known = {str(p.id) for p in older if service.knows(str(p.id))} | report.trunked
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
    trunk_id: str
    vlan_id: int
    owner: NodeTrunk | None  # whose pods its trunk carries; None: no node's


async def _trunk_subports(neutron: PortOps, nested: NestedDriver) -> dict[str, _Subport]:
    """Every trunk's subports, by port id, with their VLAN ids and whose node's trunk each
    is. Such a port is never a leftover, bound or not: binding it is the trunk driver's
    business (OVS binds it and owns it as ``trunk:subport``; others leave it as created), and
    Neutron refuses to delete a subport anyway."""
    trunks = await neutron.list_trunks()
    owners = _node_trunks(trunks, nested)
    found: dict[str, _Subport] = {}
    for trunk in trunks:
        subports = list(trunk.sub_ports or [])
        nested.vlans.mark(str(trunk.id), [int(s["segmentation_id"]) for s in subports])
        owner = owners.get(str(trunk.id))
        for sub in subports:
            vlan_id = int(sub["segmentation_id"])
            found[str(sub["port_id"])] = _Subport(str(trunk.id), vlan_id, owner)
    return found


def _node_trunks(trunks: list[Any], nested: NestedDriver) -> dict[str, NodeTrunk]:
    """The trunks that carry a node's pods, by trunk id, as ``NestedDriver.trunk_for`` picks
    them: by the configured id or the node's name, each for its own project only; a name
    several trunks of one project carry is no node's trunk (the driver refuses it too)."""
    candidates: defaultdict[NodeTrunk, list[str]] = defaultdict(list)
    for trunk in trunks:
        node = nested.node_of(str(trunk.id), str(trunk.name or ""))
        if node:
            candidates[NodeTrunk(node, str(trunk.project_id or ""))].append(str(trunk.id))
    owners: dict[str, NodeTrunk] = {}
    for owner, trunk_ids in candidates.items():
        if len(trunk_ids) > 1:
            log.info("controller.recovery.trunk_ambiguous", node=owner.node,
                     project=owner.project_id, trunks=sorted(trunk_ids))  # fmt: skip
            continue
        nested.remember_trunk(owner, trunk_ids[0])
        owners[trunk_ids[0]] = owner
    return owners


async def _pool_subports(
    service: PoolService,
    neutron: PortOps,
    nested: NestedDriver,
    subports: dict[str, _Subport],
    in_use: set[str],
    ours: list[Any] | None,
) -> int:
    """Pool the free subports, whichever owner their trunk driver left them with; ``ours``:
    the ``compute:podwire`` ports if recovery listed them already. A free port of ours on a
    trunk that is not its own project's node trunk leaves that trunk and is deleted: that
    trunk's VM would receive its traffic (an earlier podwire looked trunks up by name in
    every project)."""
    if ours is None:
        ours = await neutron.owned_ports(DEVICE_OWNER)
    owned = await neutron.owned_ports(SUBPORT_OWNER)
    free = [p for p in [*owned, *ours] if str(p.id) in subports and str(p.id) not in in_use]
    usable = [p for p in free if _on_own_trunk(p, subports[str(p.id)])]
    stray = [p for p in free if not _on_own_trunk(p, subports[str(p.id)])]
    await _remove_stray(neutron, nested, stray, subports)
    vlans = {port_id: sub.vlan_id for port_id, sub in subports.items()}
    return await _pool_ports(usable, service, neutron, lambda p: _node(subports[str(p.id)]), vlans)


def _on_own_trunk(port: Any, sub: _Subport) -> bool:
    return sub.owner is not None and sub.owner.project_id == str(port.project_id)


def _node(sub: _Subport) -> str:
    return sub.owner.node if sub.owner is not None else ""


async def _remove_stray(
    neutron: PortOps, nested: NestedDriver, ports: list[Any], subports: dict[str, _Subport]
) -> None:
    """Take free ports of ours off trunks that must not carry them, then delete them; what
    fails is logged and left (never pooled, never handed out)."""
    by_trunk: defaultdict[str, list[Any]] = defaultdict(list)
    for port in ports:
        by_trunk[subports[str(port.id)].trunk_id].append(port)
    for trunk_id, stray in by_trunk.items():
        ids = [str(p.id) for p in stray]
        owner = subports[ids[0]].owner
        facts = dict(
            trunk=trunk_id,
            node=owner.node if owner else None,
            trunk_project=owner.project_id if owner else None,
            port_projects=sorted({str(p.project_id) for p in stray}),
            ports=ids,
        )
        try:
            await neutron.remove_subports(trunk_id, ids)
            nested.vlans.release(trunk_id, [subports[p].vlan_id for p in ids])
            await delete_ports(neutron, ids)
        except PodwireError as exc:
            log.warning("controller.recovery.stray_subports_left", error=str(exc), **facts)
            continue
        log.warning("controller.recovery.stray_subports_removed", **facts)
