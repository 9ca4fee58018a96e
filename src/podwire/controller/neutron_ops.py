"""The controller's async view of Neutron: counted calls off the event loop, cached lookups.

openstacksdk is synchronous, so each call runs in a worker thread. Every call is counted by
operation (and failures separately) so the hot path's "zero Neutron calls" is observable.
Network and security group facts are cached: they are needed per request, but change rarely.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from podwire.controller.errors import (
    NetworkAmbiguous,
    NetworkDown,
    NetworkNotAllowed,
    NetworkWithoutSubnet,
    SecurityGroupNotAllowed,
    UnknownSecurityGroup,
)
from podwire.controller.metrics import ControllerMetrics
from podwire.controller.term import TermGuard
from podwire.errors import PodwireError, UnknownNetwork
from podwire.log import get_logger
from podwire.neutron.client import (
    NeutronClient,
    NeutronNotFound,
    NeutronUnavailable,
    PortSummary,
)
from podwire.neutron.vifs import NetworkInfo
from podwire.schema.deployment import DEFAULT, TAG_PREFIX, Deployment

log = get_logger(__name__)

T = TypeVar("T")
SLOW_CALL = 5.0  # seconds without an answer before readiness names Neutron
UUID_LIKE = re.compile(r"[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}")
SUBPORT_OWNER = "trunk:subport"


class PortOps(Protocol):
    """The Neutron calls recovery, recycling and the sweeper make: small enough for a fake."""

    async def networks(self, network_ids: Iterable[str]) -> dict[str, NetworkInfo]: ...
    async def update_port(self, port_id: str, **changes: Any) -> Any: ...
    async def delete_port(self, port_id: str) -> None: ...
    async def list_ports(self, **filters: Any) -> list[Any]: ...
    async def owned_ports(self, device_owner: str) -> list[PortSummary]: ...
    async def list_trunks(self, **filters: Any) -> list[Any]: ...
    async def remove_subports(self, trunk_id: str, port_ids: list[str]) -> None: ...


class NeutronOps:
    def __init__(
        self,
        client: NeutronClient,
        metrics: ControllerMetrics,
        term: TermGuard | None = None,
        deployment: Deployment = DEFAULT,
    ) -> None:
        """``term``: every write checks first that the term it was decided in is held.
        ``deployment``: whose ports these are (their tag)."""
        self._client = client
        self._deployment = deployment
        self._metrics = metrics
        self._term = term
        self._networks: dict[str, NetworkInfo] = {}
        # A request's network named by its name, as the project resolved it (id): a name is
        # looked up in Neutron once, like an id, not at every request.
        self._names: dict[tuple[str, str | None], str] = {}
        self._sg_owners: dict[str, tuple[str, bool]] = {}  # group -> (project, shared)
        self._calls = 0
        self._inflight: dict[int, tuple[str, float]] = {}  # call -> (op, started)
        self._failure: str | None = None  # the last call's outage, until one answers

    async def _call(self, op: str, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self._metrics.neutron_calls.labels(op).inc()
        self._calls += 1
        ticket = self._calls
        self._inflight[ticket] = (op, time.monotonic())
        try:
            result = await asyncio.to_thread(func, *args, **kwargs)
        except PodwireError as exc:
            self._metrics.neutron_errors.labels(op).inc()
            # Neutron refusing a request still answers; only an outage is a problem.
            self._failure = str(exc) if isinstance(exc, NeutronUnavailable) else None
            raise
        finally:
            del self._inflight[ticket]
        self._failure = None
        return result

    async def _write(self, op: str, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._term is not None:
            self._term.check(f"Neutron {op}")
        return await self._call(op, func, *args, **kwargs)

    def problem(self) -> str | None:
        """What readiness says of Neutron: a call unanswered for long, or the last call's
        outage; None while it answers."""
        now = time.monotonic()
        waiting = [(now - started, op) for op, started in self._inflight.values()]
        slow = max(waiting, default=(0.0, ""))
        if slow[0] > SLOW_CALL:
            return f"no answer for {slow[0]:.0f} s ({slow[1]})"
        return self._failure

    async def probe(self) -> None:
        """One cheap call, so a controller that needs nothing of Neutron now still knows
        whether it answers (readiness names it)."""
        await self._call("probe", self._client.list_networks, limit=1)

    # --- cached lookups -------------------------------------------------------------------

    async def network(self, name_or_id: str, project_id: str | None) -> NetworkInfo:
        """The network a request names, if its project may use it (its own or a shared one;
        without a project, any) and a port on it can work; cached once it passed.

        Raises UnknownNetwork (none by that id, or none of that name the project may use),
        NetworkNotAllowed (that id is another project's, not shared), NetworkAmbiguous
        (several of that name), NetworkDown, NetworkWithoutSubnet."""
        cached = self._networks.get(self._names.get((name_or_id, project_id), name_or_id))
        if cached is not None:
            return _allowed(cached, project_id, name_or_id)
        if UUID_LIKE.fullmatch(name_or_id):
            raw = await self._network_by_id(name_or_id)
            if raw is not None:
                _allowed(NetworkInfo.from_neutron(raw, []), project_id, name_or_id)
        else:
            raw = await self._network_by_name(name_or_id, project_id)
        if raw is None:
            scope = f" in project {project_id}" if project_id else ""
            raise UnknownNetwork(
                f"network {name_or_id!r} does not exist{scope}: fix 'network' (or 'project')"
                " in the CNI network config"
            )
        subnets = await self._call("list_subnets", self._client.list_subnets, network_id=raw.id)
        info = _usable(NetworkInfo.from_neutron(raw, subnets), name_or_id)
        self._networks[info.id] = info
        if info.id != name_or_id:
            self._names[(name_or_id, project_id)] = info.id
        return info

    async def _network_by_id(self, network_id: str) -> Any | None:
        try:
            return await self._call("get_network", self._client.get_network, network_id)
        except NeutronNotFound:
            return None

    async def _network_by_name(self, name: str, project_id: str | None) -> Any | None:
        found = await self._call("list_networks", self._client.list_networks, name=name)
        usable = [n for n in found if _may_use(project_id, str(n.project_id or ""), n.is_shared)]
        if len(usable) > 1:
            ids = ", ".join(sorted(str(n.id) for n in usable))
            raise NetworkAmbiguous(
                f"network name {name!r} is ambiguous: {len(usable)} networks"
                f"{' project ' + project_id + ' may use' if project_id else ''} carry it"
                f" ({ids}): name the network by its id in the CNI network config"
            )
        return usable[0] if usable else None

    async def networks(self, network_ids: Iterable[str]) -> dict[str, NetworkInfo]:
        """Several networks in two listings (recovery must not pay one call per port)."""
        wanted = sorted(set(network_ids) - set(self._networks))
        if wanted:
            nets = await self._call("list_networks", self._client.list_networks, id=wanted)
            subnets = await self._call("list_subnets", self._client.list_subnets, network_id=wanted)
            for net in nets:
                own = [s for s in subnets if s.network_id == net.id]
                self._networks[str(net.id)] = NetworkInfo.from_neutron(net, own)
        return {n: self._networks[n] for n in network_ids if n in self._networks}

    def forget_network(self, network_id: str) -> None:
        self._networks.pop(network_id, None)
        for name in [n for n, known in self._names.items() if known == network_id]:
            del self._names[name]

    async def check_security_groups(self, sgs: Iterable[str], project_id: str | None) -> None:
        """Every group must exist and, with ``project_id``, be that project's (or shared):
        the controller acts with admin rights, so Neutron would not refuse another
        project's group. Raises UnknownSecurityGroup or SecurityGroupNotAllowed."""
        wanted = sorted(set(sgs))
        missing = [sg for sg in wanted if sg not in self._sg_owners]
        if missing:
            found = await self._call(
                "list_security_groups", self._client.list_security_groups, id=missing
            )
            for sg in found:
                self._sg_owners[str(sg.id)] = (str(sg.project_id or ""), bool(sg.is_shared))
        unknown = [sg for sg in wanted if sg not in self._sg_owners]
        if unknown:
            raise UnknownSecurityGroup(
                f"security groups do not exist: {', '.join(unknown)}: fix 'securityGroups'"
                " in the CNI network config"
            )
        if project_id is None:
            return
        foreign = [sg for sg in wanted if not _may_use(project_id, *self._sg_owners[sg])]
        if foreign:
            raise SecurityGroupNotAllowed(
                f"security groups {', '.join(foreign)} belong to another project than"
                f" {project_id}: use groups of the pod's project in 'securityGroups'"
            )

    def forget_security_group(self, sg_id: str) -> None:
        self._sg_owners.pop(sg_id, None)

    # --- plain calls ----------------------------------------------------------------------

    async def create_ports(self, bodies: Sequence[Mapping[str, Any]]) -> list[Any]:
        tag = self._deployment.tag
        return await self._write("create_ports", self._client.create_ports, list(bodies), tag)

    async def update_port(self, port_id: str, **changes: Any) -> Any:
        return await self._write("update_port", self._client.update_port, port_id, **changes)

    async def delete_port(self, port_id: str) -> None:
        await self._write("delete_port", self._client.delete_port, port_id)

    async def list_ports(self, **filters: Any) -> list[Any]:
        return await self._call("list_ports", self._client.list_ports, **filters)

    async def list_port_summaries(self, **filters: str) -> list[PortSummary]:
        return await self._call("list_ports", self._client.list_port_summaries, **filters)

    async def owned_ports(self, device_owner: str) -> list[PortSummary]:
        """This deployment's ports of ``device_owner``: those with its tag. The default
        deployment also adopts (tags) ports with no deployment's tag, which podwire created
        before deployments existed; no other deployment ever sees them."""
        deployment = self._deployment
        if not deployment.adopts_untagged:
            return await self.list_port_summaries(device_owner=device_owner, tags=deployment.tag)
        ports = await self.list_port_summaries(device_owner=device_owner)
        untagged = [p for p in ports if not any(t.startswith(TAG_PREFIX) for t in p.tags)]
        for port in untagged:
            await self._write("tag_port", self._client.tag_port, port.id, deployment.tag)
        if untagged:
            log.info("controller.ports_adopted", tag=deployment.tag, ports=len(untagged))
        adopted = {p.id for p in untagged}
        return [p for p in ports if deployment.tag in p.tags or p.id in adopted]

    async def list_trunks(self, **filters: Any) -> list[Any]:
        return await self._call("list_trunks", self._client.list_trunks, **filters)

    async def get_trunk(self, trunk_id: str) -> Any:
        return await self._call("get_trunk", self._client.get_trunk, trunk_id)

    async def add_subports(self, trunk_id: str, subports: list[dict[str, Any]]) -> None:
        await self._write("add_subports", self._client.add_trunk_subports, trunk_id, subports)

    async def remove_subports(self, trunk_id: str, port_ids: list[str]) -> None:
        await self._write("remove_subports", self._client.delete_trunk_subports, trunk_id, port_ids)


async def delete_ports(neutron: PortOps, port_ids: list[str], concurrency: int = 10) -> None:
    """Delete concurrently; the first failure is raised after every deletion was tried."""
    gate = asyncio.Semaphore(concurrency)

    async def one(port_id: str) -> None:
        async with gate:
            await neutron.delete_port(port_id)

    results = await asyncio.gather(*(one(p) for p in port_ids), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def _may_use(project_id: str | None, owner: str, shared: bool) -> bool:
    return project_id is None or owner == project_id or shared


def _allowed(info: NetworkInfo, project_id: str | None, ref: str) -> NetworkInfo:
    if not _may_use(project_id, info.project_id, info.shared):
        raise NetworkNotAllowed(
            f"network {ref!r} belongs to another project and is not shared: project"
            f" {project_id} may not use it (fix 'network' or 'project' in the CNI network config)"
        )
    return info


def _usable(info: NetworkInfo, ref: str) -> NetworkInfo:
    """Refuses what would attach a pod that cannot talk: a down network, no subnet."""
    name = f"network {ref!r}" if ref == info.id else f"network {ref!r} ({info.id})"
    if not info.admin_up:
        raise NetworkDown(
            f"{name} is administratively down (admin_state_up false): set it up in Neutron"
        )
    if not info.subnets:
        raise NetworkWithoutSubnet(
            f"{name} has no subnet, so a pod would get no address: add a subnet in Neutron"
        )
    return info
