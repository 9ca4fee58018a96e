"""Only ports podwire's ml2 driver bound may reach a pool: failed bindings are retried, then
deleted.

Neutron creates a port even when no mechanism driver can bind it to the host; it then carries
``binding:vif_type = binding_failed`` and no agent will ever wire it. ml2 binds again whenever a
port whose binding failed is updated, so re-setting its host is a retry (it succeeds e.g. once
the node's agent has registered). Ports still failed after ``retries`` re-sets are deleted, so
they neither sit in a pool nor leak in Neutron.
"""

from __future__ import annotations

import asyncio
from typing import Any

from podwire.controller.neutron_ops import NeutronOps, delete_ports
from podwire.errors import PodwireError
from podwire.log import get_logger
from podwire.neutron.vifs import is_bound

log = get_logger(__name__)


async def settle_bindings(
    neutron: NeutronOps, host: str, ports: list[Any], retries: int
) -> list[Any]:
    """The ports bound by podwire, after up to ``retries`` rebinds of the others; the rest are
    deleted. Returned ports are the latest Neutron views (a rebind changes the binding)."""
    bound = [p for p in ports if is_bound(p)]
    failed = [p for p in ports if not is_bound(p)]
    for _ in range(retries):
        if not failed:
            break
        rebound, failed = await _rebind(neutron, host, failed)
        bound += rebound
    if failed:
        ids = [str(p.id) for p in failed]
        log.warning(
            "pool.binding_failed",
            host=host,
            ports=ids,
            vif_types=sorted({str(p.binding_vif_type) for p in failed}),
            retries=retries,
        )
        await delete_ports(neutron, ids)
    return bound


async def _rebind(neutron: NeutronOps, host: str, ports: list[Any]) -> tuple[list[Any], list[Any]]:
    results = await asyncio.gather(
        *(neutron.update_port(str(p.id), binding_host_id=host) for p in ports),
        return_exceptions=True,
    )
    bound: list[Any] = []
    failed: list[Any] = []
    for port, result in zip(ports, results, strict=True):
        if isinstance(result, PodwireError):
            log.warning("pool.rebind_failed", port=port.id, error=str(result))
            failed.append(port)
        elif isinstance(result, BaseException):
            raise result
        else:
            (bound if is_bound(result) else failed).append(result)
    return bound, failed
