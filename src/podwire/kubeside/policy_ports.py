"""In-use ports follow their pods' NetworkPolicy groups, after every reconciler pass.

A pod's port got its groups when it was handed out (``side.KubernetesSide.pod_groups``); a
policy made or deleted, or a pod relabelled, later changes what the port must carry: each port
whose set changed is moved by one port update (``PortMover.regroup``: the controller's
``VifBroker``, in turn with its attachment's requests and releases), and pooled ports are
cleared of a group about to be deleted, as the admin's removal of a group does, so that Neutron
can delete it. Addresses need nothing here: address groups follow the pods' labels in the pass
itself."""

from __future__ import annotations

import asyncio

from podwire.kubeside.policy_view import PolicyView, wanted_groups
from podwire.kubeside.pools import PoolChanges, PortMover, TermPorts
from podwire.log import get_logger
from podwire.schema.inuse import InUse, SgKey, sg_key

log = get_logger(__name__)

CONCURRENCY = 10  # port updates in flight at once when many pods move together


class PolicyPorts:
    def __init__(
        self, service: TermPorts, broker: PortMover, admin: PoolChanges, project_id: str
    ) -> None:
        """``project_id``: where the groups are made, so the one project whose ports move."""
        self._service = service
        self._broker = broker
        self._admin = admin
        self._project_id = project_id

    async def follow(self, view: PolicyView) -> int:
        """Move every in-use port whose groups the pass changed; returns how many moved. A
        failed update fails the pass (retried with backoff), after the others are done."""
        slots = asyncio.Semaphore(CONCURRENCY)
        moves = []
        for ident, record in self._service.attachments.items():
            wanted = wanted_groups(record, view, self._project_id)
            if wanted is not None and wanted != sg_key(record.vif.security_groups):
                moves.append((ident, record, wanted))

        async def move(ident: tuple[str, str], record: InUse, wanted: SgKey) -> bool:
            async with slots:
                return await self._broker.regroup(ident, record, wanted)

        results = await asyncio.gather(*(move(*m) for m in moves), return_exceptions=True)
        moved = [m[1].vif.port_id for m, done in zip(moves, results, strict=True) if done is True]
        if moved:
            log.info("netpol.ports_moved", ports=sorted(moved))
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return len(moved)

    async def clear_group(self, group_id: str) -> int:
        """Pooled ports carrying a group about to be deleted lose their groups (they are
        given a pod's by the one update a take makes for any other set)."""
        pools = self._service.pools
        carried = (group_id in sgs for key in pools.pool_keys() for sgs, _ in pools.groups(key))
        if not any(carried):
            return 0
        return await self._admin.remove_security_group(group_id, None)
