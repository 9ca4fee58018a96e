"""What the Kubernetes side uses of the controller's pools, as protocols that the controller's
own classes satisfy as they are (``controller.app`` hands those in): this side never imports
the controller."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Protocol

from podwire.neutron.vifs import NetworkInfo
from podwire.schema.inuse import InUse, PoolKey, SgKey

Ident = tuple[str, str]  # an attachment's (node, attachment)


class TermPorts(Protocol):
    """A leader term's ports (``controller.pool_service.PoolService``): the in-use records,
    read only, and who hears them change; the pools' groups; the term's background tasks; the
    networks and the nodes' liveness the pools go by."""

    attachment_listeners: list[Callable[[], None]]  # called whenever a record came or went

    @property
    def attachments(self) -> Mapping[Ident, InUse]: ...
    @property
    def pools(self) -> PoolGroups: ...
    @property
    def neutron(self) -> NetworkLookup: ...
    @property
    def liveness(self) -> LiveNodes: ...
    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run it among the term's background tasks (closed unrun once the term ends)."""


class PoolGroups(Protocol):
    """The pools' free ports by security-group set (``controller.pools.PoolsView``)."""

    def pool_keys(self) -> list[PoolKey]: ...
    def groups(self, key: PoolKey) -> list[tuple[SgKey, list[str]]]: ...


class NetworkLookup(Protocol):
    """The pools' view of Neutron's networks (``controller.neutron_ops.NeutronOps``)."""

    async def network(self, name_or_id: str, project_id: str | None) -> NetworkInfo:
        """A network a port can be made on; raises ``podwire.errors.UnknownNetwork`` for one
        Neutron does not have (other permanent errors for one that cannot serve)."""


class LiveNodes(Protocol):
    """The nodes with a live agent (``controller.liveness.Liveness``)."""

    async def alive_nodes(self) -> set[str]: ...


class PortMover(Protocol):
    """In-use ports moved (``controller.vif_broker.VifBroker``), each in turn with its
    attachment's requests and releases."""

    async def regroup(self, ident: Ident, record: InUse, wanted: SgKey) -> bool:
        """One port update, then its record; False when the record was released or replaced
        meanwhile (whoever replaced it decided its groups afresh)."""


class PoolChanges(Protocol):
    """The pools' admin (``controller.pool_admin.PoolAdmin``): a network's pools filled or
    deleted, a group taken off the pooled ports."""

    async def populate(
        self,
        nodes: Iterable[str],
        network_ref: str,
        project_id: str | None,
        security_groups: Iterable[str],
        count: int,
    ) -> dict[str, int]: ...
    async def delete_network_pools(self, network_id: str) -> int: ...
    async def remove_security_group(self, sg_id: str, network_id: str | None) -> int: ...
