"""Released ports go back to their pools with their current SGs.

A released port is not reused as it was: its SGs may have been changed by someone else while
it was in use. Their current value comes from the ml2 forwarder's mirror in etcd while a
forwarder vouches for it, else (and for ports the mirror does not show bound) from Neutron
listings by id. Above the pool's ``max``, or when its binding has failed meanwhile, a released
port is deleted instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from podwire.config import PoolSettings
from podwire.controller.drivers import AVAILABLE_NAME
from podwire.controller.neutron_ops import PortOps
from podwire.controller.pool_service import PoolService, TermState
from podwire.controller.pools import with_sgs
from podwire.log import get_logger
from podwire.neutron.vifs import binding_failed, is_bound
from podwire.schema.inuse import PoolKey

log = get_logger(__name__)

LIST_CHUNK = 80  # port ids per listing: keeps the request line under 4 KiB


class PortFacts(Protocol):
    """Where current SGs come from without asking Neutron (the forwarder's mirror)."""

    async def bound_sgs(self, ports: Mapping[str, PoolKey]) -> dict[str, list[str]] | None: ...


async def recycle_once(
    service: PoolService, neutron: PortOps, settings: PoolSettings, facts: PortFacts | None = None
) -> tuple[int, int]:
    """Return recyclable ports to pools or delete them; returns (returned, deleted)."""
    pending = service.pools.recyclable()
    if not pending:
        return 0, 0
    mirrored = await facts.bound_sgs(pending) if facts is not None else None
    asked = [port_id for port_id in pending if mirrored is None or port_id not in mirrored]
    current, failed = await _current_sgs(neutron, asked) if asked else ({}, set())
    current.update(mirrored or {})
    returned = deleted = 0
    for port_id, key in pending.items():
        sgs = current.get(port_id)
        if sgs is None:  # deleted in Neutron meanwhile
            service.term.pools.forget(port_id)
            continue
        if port_id in failed or (settings.max and service.pool_size(key) >= settings.max):
            await _delete(service, key, port_id)
            deleted += 1
            continue
        if settings.port_debug:
            await neutron.update_port(port_id, name=AVAILABLE_NAME, device_id="")
        _return(service.term, key, port_id, sgs)
        returned += 1
    # A pass per release burst: routine ones are debug, the ones that cost Neutron are not.
    report = log.info if deleted or asked else log.debug
    report("pool.recycled", returned=returned, deleted=deleted, asked_neutron=len(asked))
    return returned, deleted


def _return(term: TermState, key: PoolKey, port_id: str, sgs: list[str]) -> None:
    """A recycled port back in its pool, carrying the SGs Neutron reports now."""
    vif = term.pools.vif(port_id)
    term.pools.finish_recycle(port_id)
    if vif is not None:
        term.pools.add(key, [with_sgs(vif, sgs)])
        term.refiller.sizer.returned(key, time.monotonic())


async def _delete(service: PoolService, key: PoolKey, port_id: str) -> None:
    """Delete a released port (pool full or binding failed) through its node's driver."""
    vif = service.pools.vif(port_id)
    driver = await service.drivers.for_node(key.node)
    if vif is not None:
        await driver.delete(key, [vif])
    service.term.pools.forget(port_id)


async def _current_sgs(
    neutron: PortOps, port_ids: list[str]
) -> tuple[dict[str, list[str]], set[str]]:
    """SGs by port, and the ports whose binding has failed or gone meanwhile (deleted, not
    reused: no agent could wire them)."""
    current: dict[str, list[str]] = {}
    failed: set[str] = set()
    for start in range(0, len(port_ids), LIST_CHUNK):
        ports = await neutron.list_ports(id=port_ids[start : start + LIST_CHUNK])
        current.update({str(p.id): list(p.security_group_ids or []) for p in ports})
        failed.update(str(p.id) for p in ports if binding_failed(p) or not is_bound(p))
    return current, failed
