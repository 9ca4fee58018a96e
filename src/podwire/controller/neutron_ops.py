"""The controller's async view of Neutron: counted calls off the event loop, cached lookups.

openstacksdk is synchronous, so each call runs in a worker thread. Every call is counted by
operation (and failures separately) so the hot path's "zero Neutron calls" is observable.
Network and security group facts are cached: they are needed per request, but change rarely.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from podwire.controller.errors import UnknownResource
from podwire.controller.metrics import ControllerMetrics
from podwire.errors import PodwireError
from podwire.neutron.client import NeutronClient, PortSummary
from podwire.neutron.vifs import NetworkInfo

T = TypeVar("T")
SUBPORT_OWNER = "trunk:subport"


class PortOps(Protocol):
    """The Neutron calls recovery, recycling and the sweeper make: small enough for a fake."""

    async def networks(self, network_ids: Iterable[str]) -> dict[str, NetworkInfo]: ...
    async def update_port(self, port_id: str, **changes: Any) -> Any: ...
    async def delete_port(self, port_id: str) -> None: ...
    async def list_ports(self, **filters: Any) -> list[Any]: ...
    async def list_port_summaries(self, **filters: str) -> list[PortSummary]: ...
    async def list_trunks(self, **filters: Any) -> list[Any]: ...


class NeutronOps:
    def __init__(self, client: NeutronClient, metrics: ControllerMetrics) -> None:
        self._client = client
        self._metrics = metrics
        self._networks: dict[str, NetworkInfo] = {}
        self._known_sgs: set[str] = set()

    async def _call(self, op: str, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self._metrics.neutron_calls.labels(op).inc()
        try:
            return await asyncio.to_thread(func, *args, **kwargs)
        except PodwireError:
            self._metrics.neutron_errors.labels(op).inc()
            raise

    # --- cached lookups -------------------------------------------------------------------

    def cached_network(self, network_id: str) -> NetworkInfo | None:
        return self._networks.get(network_id)

    async def network(self, name_or_id: str, project_id: str | None) -> NetworkInfo:
        cached = self._networks.get(name_or_id)
        if cached is not None:
            return _visible(cached, project_id, name_or_id)
        raw = await self._call("find_network", self._client.find_network, name_or_id)
        if raw is None:
            raise UnknownResource(f"network {name_or_id!r} does not exist")
        subnets = await self._call("list_subnets", self._client.list_subnets, network_id=raw.id)
        info = NetworkInfo.from_neutron(raw, subnets)
        self._networks[info.id] = info
        return _visible(info, project_id, name_or_id)

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

    async def check_security_groups(self, sgs: Iterable[str]) -> None:
        missing = sorted(set(sgs) - self._known_sgs)
        if not missing:
            return
        found = await self._call(
            "list_security_groups", self._client.list_security_groups, id=missing
        )
        self._known_sgs.update(str(sg.id) for sg in found)
        unknown = [sg for sg in missing if sg not in self._known_sgs]
        if unknown:
            raise UnknownResource(f"security groups do not exist: {', '.join(unknown)}")

    def forget_security_group(self, sg_id: str) -> None:
        self._known_sgs.discard(sg_id)

    # --- plain calls ----------------------------------------------------------------------

    async def create_ports(self, bodies: Sequence[Mapping[str, Any]]) -> list[Any]:
        return await self._call("create_ports", self._client.create_ports, list(bodies))

    async def update_port(self, port_id: str, **changes: Any) -> Any:
        return await self._call("update_port", self._client.update_port, port_id, **changes)

    async def delete_port(self, port_id: str) -> None:
        await self._call("delete_port", self._client.delete_port, port_id)

    async def list_ports(self, **filters: Any) -> list[Any]:
        return await self._call("list_ports", self._client.list_ports, **filters)

    async def list_port_summaries(self, **filters: str) -> list[PortSummary]:
        return await self._call("list_ports", self._client.list_port_summaries, **filters)

    async def list_trunks(self, **filters: Any) -> list[Any]:
        return await self._call("list_trunks", self._client.list_trunks, **filters)

    async def find_trunk(self, name_or_id: str) -> Any | None:
        return await self._call("find_trunk", self._client.find_trunk, name_or_id)

    async def add_subports(self, trunk_id: str, subports: list[dict[str, Any]]) -> None:
        await self._call("add_subports", self._client.add_trunk_subports, trunk_id, subports)

    async def remove_subports(self, trunk_id: str, port_ids: list[str]) -> None:
        await self._call("remove_subports", self._client.delete_trunk_subports, trunk_id, port_ids)


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


def _visible(info: NetworkInfo, project_id: str | None, ref: str) -> NetworkInfo:
    if project_id and project_id != info.project_id and not info.shared:
        raise UnknownResource(f"network {ref!r} does not exist in project {project_id!r}")
    return info
