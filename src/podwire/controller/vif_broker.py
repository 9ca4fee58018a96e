"""The VIF API's side of a term: a node's request for an attachment's port, and its release.

Request path, in order of cost: an exact SG match costs no Neutron call; reusing another
group's port costs one port update; an empty pool makes the request wait (first come, first
served) for a refill. In-use attachments go to etcd before the VIF is returned, so a restarted
controller never hands the same port out twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, NoReturn

from podwire.controller.drivers import PortDriver
from podwire.controller.errors import BindingFailed, PoolNotReady, SubnetFull
from podwire.controller.liveness import no_agent
from podwire.controller.pool_admin import PoolAdmin
from podwire.controller.pool_service import PoolDeps, PoolService
from podwire.controller.pools import Taken, Waiter, with_sgs
from podwire.errors import PodwireError
from podwire.log import get_logger
from podwire.neutron.client import NeutronAddressesExhausted, NeutronNotFound
from podwire.neutron.vifs import NetworkInfo
from podwire.schema.inuse import InUse, PoolKey, SgKey, sg_key
from podwire.schema.vif import PodRef, Vif, VifRequest

log = get_logger(__name__)

# How long a request whose pool holds only ports the mirror does not show yet waits for them
# once its refill is done: the forwarder writes within milliseconds while it runs.
UNSEEN_WAIT = 5.0

# A pod's NetworkPolicy groups (their Neutron ids) for a port of the given project.
PodGroups = Callable[[PodRef, str], Awaitable[tuple[str, ...]]]
# The network of a pod's namespace (its id), None for the one the request names.
PodNetwork = Callable[[PodRef], Awaitable[str | None]]


class VifBroker:
    def __init__(self, service: PoolService, admin: PoolAdmin, deps: PoolDeps) -> None:
        """``admin``: frees a removed node's pools after its attachments."""
        self._service = service
        self._term = service.term
        self._admin = admin
        self._deps = deps
        # One lock per attachment with requests or releases under way: they are served in
        # arrival order (asyncio's locks are first come, first served).
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._lock_users: dict[tuple[str, str], int] = {}
        # With [kubernetes]: the groups a pod's policies give its port, added to the request's.
        self.pod_groups: PodGroups | None = None
        # With [kubernetes]: told why a pod's request failed (the Kubernetes Event's source).
        self.pod_failed: Callable[[PodRef, PodwireError], None] | None = None
        self.pod_network: PodNetwork | None = None

    async def request(self, node: str, req: VifRequest) -> Vif:
        """The attachment's VIF. Requests and releases of one attachment are served one at a
        time in arrival order, so a release that arrives after a request undoes it, and one
        that arrives before it leaves the request to hold the port."""
        self._service.check_serving()
        ident = (node, req.attachment)
        known = self._term.attachments.get(ident)
        if known is not None and not _replacing(req, known):
            return known.vif
        async with self._serialised(ident):
            self._service.check_serving()
            known = self._term.attachments.get(ident)
            if known is not None and not _replacing(req, known):
                return known.vif
            try:
                return await self._request(node, req)
            except PodwireError as exc:
                if self.pod_failed is not None and req.pod is not None:
                    self.pod_failed(req.pod, exc)
                raise

    @contextlib.asynccontextmanager
    async def _serialised(self, ident: tuple[str, str]) -> AsyncIterator[None]:
        lock = self._locks.setdefault(ident, asyncio.Lock())
        self._lock_users[ident] = self._lock_users.get(ident, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._lock_users[ident] -= 1
            if not self._lock_users[ident]:
                del self._lock_users[ident], self._locks[ident]

    async def _request(self, node: str, req: VifRequest) -> Vif:
        network_ref = req.network
        if self.pod_network is not None and req.pod is not None:
            network_ref = await self.pod_network(req.pod) or req.network
        network = await self._deps.neutron.network(network_ref, req.project_id)
        project = req.project_id or network.project_id
        await self._deps.neutron.check_security_groups(req.security_groups, project)
        wanted = req.security_groups
        if self.pod_groups is not None and req.pod is not None:
            # Decided before a port is taken: the pod is isolated from its first packet.
            wanted = sg_key((*wanted, *await self.pod_groups(req.pod, project)))
        key = PoolKey(node, project, network.id)
        driver = await self._deps.drivers.for_node(node)
        if driver.pooled:
            vif = await self._from_pool(key, wanted, driver, network)
        else:
            vif = await self._create_one(key, wanted, driver, network)
        record = InUse(node, req.attachment, key, vif, pod=req.pod)
        try:
            # Over a vanished port's record, when it replaces one.
            await self._deps.store.put(record)
        except BaseException:
            await self._undo_take(driver, key, vif)
            raise
        vanished = self._term.attachments.hold(record)
        if vanished is not None:
            await self._vanished(driver, vanished)
        if self._deps.settings.port_debug:
            self._service.spawn(self._name_port(vif.port_id, req))
        return vif

    async def _vanished(self, driver: PortDriver, record: InUse) -> None:
        """The agent could not wire this port (its desired key went away): recycled, the
        recycler drops it if Neutron no longer has it bound and pools it again if it does."""
        log.info("pool.port_vanished", node=record.node, port=record.vif.port_id)
        self._term.refiller.sizer.released(record.key, time.monotonic())
        if driver.pooled:
            self._term.pools.release(record.key, record.vif.port_id)
            self._service.released.set()
        else:
            self._term.pools.forget(record.vif.port_id)
            with contextlib.suppress(PodwireError):
                await driver.delete(record.key, [record.vif])

    async def _create_one(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> Vif:
        try:
            vifs = await driver.create(key, wanted, 1, network)
        except BindingFailed as exc:
            _raise_refill_failure(key, network, exc)
        if not vifs:
            raise PoolNotReady(f"the port for pool {tuple(key)} could not be bound; retry")
        return vifs[0]

    async def _from_pool(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> Vif:
        self._term.refiller.sizer.request(key, time.monotonic())
        taken = self._term.pools.take(key, wanted)
        if taken is None:
            self._deps.metrics.misses.inc()
            taken = await self._wait_for_port(key, wanted, driver, network)
        elif taken.sg_update:
            self._deps.metrics.reuses.inc()
        else:
            self._deps.metrics.hits.inc()
        if self._term.refiller.short(key):
            self._service.spawn(self._background_refill(key, wanted, driver, network))
        return await self._apply_sgs(taken)

    async def _wait_for_port(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> Taken:
        if network.physnet is not None:  # a miss costs Neutron calls anyway; this is one read
            name = f"{network.name} ({network.id})" if network.name else network.id
            await self._deps.liveness.require_physnet(key.node, name, network.physnet)
        got: asyncio.Future[Taken] = asyncio.get_running_loop().create_future()
        waiter = Waiter(wanted, got.set_result, got.set_exception)
        self._term.pools.wait(key, waiter)
        refill = asyncio.ensure_future(self._term.refiller.refill(key, wanted, driver, network))
        either: set[asyncio.Future[Any]] = {refill, got}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            waiter.cancelled = True
            self._service.keep(refill)
            raise
        if got.done():
            # Served (a recycled port, another refill's batch) or failed by a refill that found
            # the subnets full: this refill goes on for the requests behind, but this one does
            # not wait for the rest of it.
            self._service.keep(refill)
            return _outcome(got, key, network)
        try:
            refill.result()
        except PodwireError as exc:
            if not got.done():
                waiter.cancelled = True
                _raise_refill_failure(key, network, exc)
        except BaseException:
            waiter.cancelled = True
            raise
        if not got.done() and self._term.pools.unseen(key):
            await asyncio.wait({got}, timeout=UNSEEN_WAIT)  # served or failed: _outcome says
        if not got.done():
            waiter.cancelled = True
            raise PoolNotReady(self._not_ready(key))
        return _outcome(got, key, network)

    def _not_ready(self, key: PoolKey) -> str:
        if self._deps.liveness.noted_dead(key.node):
            return f"pool {tuple(key)} is empty: {no_agent(key.node)}"
        unseen = len(self._term.pools.unseen(key))
        if unseen:
            return (
                f"pool {tuple(key)}: the bindings of its {unseen} new ports have not reached"
                f" etcd after {UNSEEN_WAIT:.0f} s (is the ml2 forwarder running?); retry"
            )
        return f"pool {tuple(key)} has no port ready yet; retry"

    async def _apply_sgs(self, taken: Taken) -> Vif:
        if not taken.sg_update:
            return taken.vif
        try:
            await self._deps.neutron.update_port(
                taken.vif.port_id, security_group_ids=list(taken.wanted)
            )
        except BaseException:
            self._term.pools.add(taken.key, [taken.vif], oldest=True)
            raise
        vif = with_sgs(taken.vif, taken.wanted)
        self._term.pools.adopt(taken.key, vif)
        return vif

    async def regroup(self, ident: tuple[str, str], record: InUse, wanted: SgKey) -> bool:
        """Move an in-use port to another set of security groups (its pod's NetworkPolicy
        groups changed): one port update, then its record. Served in turn with the
        attachment's requests and releases; a record released or replaced meanwhile is left
        alone (returns False: whoever replaced it decided its groups afresh)."""
        async with self._serialised(ident):
            if self._term.attachments.get(ident) is not record:
                return False
            port_id = record.vif.port_id
            try:
                await self._deps.neutron.update_port(port_id, security_group_ids=list(wanted))
            except NeutronNotFound:
                # Deleted in Neutron while in use: its node's agent asks for another port
                # (``replaces``), whose groups are decided then.
                log.info("pool.regroup_port_gone", node=ident[0], port=port_id)
                return False
            moved = replace(record, vif=with_sgs(record.vif, wanted))
            await self._deps.store.put(moved)
            self._term.attachments.hold(moved)
            self._term.pools.adopt(record.key, moved.vif)
            return True

    async def _undo_take(self, driver: PortDriver, key: PoolKey, vif: Vif) -> None:
        if driver.pooled:
            self._term.pools.add(key, [vif], oldest=True)
            return
        with contextlib.suppress(PodwireError):
            await driver.delete(key, [vif])

    async def _name_port(self, port_id: str, req: VifRequest) -> None:
        """Debug naming only: a failure costs a name, never the pod's port."""
        try:
            pod = req.pod or PodRef("", "")
            await self._deps.neutron.update_port(port_id, name=pod.name, device_id=pod.uid)
        except PodwireError as exc:
            log.warning("pool.port_naming_failed", port=port_id, error=str(exc))

    async def release(self, node: str, attachment: str, reuse: bool = True) -> None:
        """``reuse=False``: the port is deleted instead of pooled again (a pod the API no
        longer has, whose node may still have the port plugged: its agent did not unplug
        it, so it must not go to another pod)."""
        self._service.check_serving()
        ident = (node, attachment)
        if self._term.attachments.get(ident) is None and ident not in self._locks:
            return
        async with self._serialised(ident):
            record = await self._drop_record(ident)
            if record is None:
                return
            driver = await self._deps.drivers.for_node(node)
            if driver.pooled and reuse:
                self._term.pools.release(record.key, record.vif.port_id)
                self._service.released.set()
            else:
                self._term.pools.forget(record.vif.port_id)
                await driver.delete(record.key, [record.vif])

    async def _drop_record(self, ident: tuple[str, str]) -> InUse | None:
        """Delete an attachment's in-use record (under its lock); returns it unless there was
        none or another record still holds its port."""
        record = self._term.attachments.get(ident)
        if record is None:
            return None
        await self._deps.store.delete(*ident)
        self._term.refiller.sizer.released(record.key, time.monotonic())
        return self._term.attachments.drop(ident)

    async def remove_node(self, node: str, reason: str) -> list[str]:
        """Everything a node held, as when it is deleted from the cluster: its attachments'
        ports are deleted in Neutron (its pods went with it, so their addresses are free at
        once), then their records go and its pools are freed. Returns the in-use ports
        deleted. A failed delete leaves the records, so the removal can simply be repeated
        (deleting a port already gone is no error). ``reason``: ``removed`` (an operator) or
        ``dead`` (no agent for ``pool.node_release_after``)."""
        self._service.check_serving()
        held = self._term.attachments.of_node(node)
        doomed: dict[PoolKey, list[Vif]] = {}
        for ident, record in held.items():
            if not self._term.attachments.held_elsewhere(ident, record):
                doomed.setdefault(record.key, []).append(record.vif)
        driver = await self._deps.drivers.for_node(node)
        for key, vifs in doomed.items():
            await driver.delete(key, vifs)
        for ident in held:
            async with self._serialised(ident):
                dropped = await self._drop_record(ident)
            if dropped is not None:
                self._term.pools.forget(dropped.vif.port_id)
        freed = await self._admin.remove_nodes([node])
        released = sorted(v.port_id for vifs in doomed.values() for v in vifs)
        self._deps.metrics.nodes_released.labels(reason).inc()
        log.warning("controller.node_released", node=node, reason=reason, pool_ports=freed,
                    ports=released)  # fmt: skip
        return released

    async def _background_refill(
        self, key: PoolKey, wanted: SgKey, driver: PortDriver, network: NetworkInfo
    ) -> None:
        try:
            await self._term.refiller.top_up(key, wanted, driver, network)
        except PodwireError as exc:
            log.warning("pool.refill_failed", key=key, error=str(exc))


def _outcome(got: asyncio.Future[Taken], key: PoolKey, network: NetworkInfo) -> Taken:
    """The port a waiting request was given, or why none can be (a full subnet)."""
    failure = got.exception()
    if isinstance(failure, PodwireError):
        _raise_refill_failure(key, network, failure)
    if failure is not None:
        raise failure
    return got.result()


def _raise_refill_failure(key: PoolKey, network: NetworkInfo, exc: PodwireError) -> NoReturn:
    failure = _refill_failure(key, network, exc)
    if failure is exc:
        raise exc
    raise failure from exc


def _refill_failure(key: PoolKey, network: NetworkInfo, exc: PodwireError) -> PodwireError:
    """What a request whose pool could not be filled is told: retry only when it may help.
    Ports that did not bind are retried like a node without an agent: the node's agent may
    register, or come to serve the network, at any moment."""
    if isinstance(exc, BindingFailed):
        return PoolNotReady(f"pool {tuple(key)} could not be filled: {exc}; retry")
    if isinstance(exc, NeutronAddressesExhausted):
        cidrs = ", ".join(sorted(s.cidr for s in network.subnets.values()))
        return SubnetFull(
            f"network {network.name or network.id} ({network.id}) has no free address in its"
            f" subnets ({cidrs}): free addresses or add a subnet in Neutron ({exc})"
        )
    if not exc.retryable:
        return exc
    return PoolNotReady(f"pool {tuple(key)} could not be filled: {exc}")


def _replacing(req: VifRequest, known: InUse) -> bool:
    """Whether the request asks for another port than the one the attachment holds (it
    vanished before its node wired it)."""
    return req.replaces is not None and req.replaces == known.vif.port_id
