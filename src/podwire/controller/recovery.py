"""Rebuild the pools at start (or on taking over leadership) before any request is served.

Neutron is the truth about which ports exist, etcd about which are in use. Everything comes
from a few listings (ports of our owner, trunks, their networks and subnets), never one call
per port, so thousands of pool ports are recovered in seconds. Ports without a usable binding
cannot be handed out and are deleted (leftovers of a crash mid-create or of a dead node).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from podwire.controller.drivers import delete_ports
from podwire.controller.nested import NestedDriver
from podwire.controller.netinfo import is_bound, port_to_vif
from podwire.controller.neutron_ops import DEVICE_OWNER, SUBPORT_OWNER
from podwire.controller.pools import PoolKey
from podwire.controller.service import PoolService
from podwire.errors import ValidationError
from podwire.log import get_logger
from podwire.vif import Vif

log = get_logger(__name__)


@dataclass
class RecoveryReport:
    pooled: int = 0
    in_use: int = 0
    deleted: int = 0
    subports: int = 0


async def recover(service: PoolService, nested: NestedDriver | None) -> RecoveryReport:
    report = RecoveryReport()
    records, _ = await service.store.load()
    in_use = {r.vif.port_id for r in records}
    for record in records:
        service.attachments[(record.node, record.attachment)] = record
        service.pools.adopt(record.key, record.vif)
    report.in_use = len(records)
    ports = await service.neutron.list_port_summaries(device_owner=DEVICE_OWNER)
    free = [p for p in ports if str(p.id) not in in_use]
    leftovers = [str(p.id) for p in free if not is_bound(p)]
    await delete_ports(service.neutron, leftovers)
    report.deleted = len(leftovers)
    bound = [p for p in free if is_bound(p)]
    report.pooled = await _pool_ports(bound, service, lambda p: str(p.binding_host_id), {})
    if nested is not None:
        report.subports = await _recover_subports(service, nested, in_use)
    service.metrics.in_use.set(len(service.attachments))
    log.info("controller.recovered", **report.__dict__)
    return report


async def _pool_ports(
    ports: list[Any], service: PoolService, node_of: Callable[[Any], str], vlans: dict[str, int]
) -> int:
    """Add ports to pools keyed by their host (or trunk node), project and network."""
    networks = await service.neutron.networks({str(p.network_id) for p in ports})
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
    for key, vifs in by_key.items():
        service.pools.add(key, vifs)
        service.metrics.pool_size.labels(*key).set(service.pools.size(key))
    return sum(len(v) for v in by_key.values())


async def _recover_subports(service: PoolService, nested: NestedDriver, in_use: set[str]) -> int:
    """Subports of trunks named after nodes: re-learn their VLAN ids and pool the free ones."""
    trunks = await service.neutron.list_trunks()
    vlans: dict[str, int] = {}
    node_of: dict[str, str] = {}
    for trunk in trunks:
        nested.remember_trunk(str(trunk.name), str(trunk.id))
        subports = list(trunk.sub_ports or [])
        nested.vlans.mark(str(trunk.id), [int(s["segmentation_id"]) for s in subports])
        for sub in subports:
            vlans[str(sub["port_id"])] = int(sub["segmentation_id"])
            node_of[str(sub["port_id"])] = str(trunk.name)
    if not vlans:
        return 0
    ports = await service.neutron.list_port_summaries(device_owner=SUBPORT_OWNER)
    free = [p for p in ports if str(p.id) in vlans and str(p.id) not in in_use]
    return await _pool_ports(free, service, lambda p: node_of[str(p.id)], vlans)
