"""The Neutron side of a namespace's own network (``podwire.io/network: auto``): a network,
one subnet from the cluster's subnet pool, and that subnet's interface on the cluster router.

Every call is idempotent (``ensure`` finds what an earlier, interrupted call made), and
podwire's mark is two tags on the network: the deployment's, and one carrying the namespace's
uid. Only a network carrying both is ever found, so only podwire's own is ever deleted, and
a namespace recreated under the same name gets a network of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podwire.neutron.client import _translated

MARK_PREFIX = "podwire-ns:"
NAME_PREFIX = "podwire-ns-"


@dataclass(frozen=True)
class NamespaceNetwork:
    network_id: str
    subnet_ids: tuple[str, ...]


def namespace_mark(uid: str) -> str:
    return MARK_PREFIX + uid


class NamespaceNetworkObjects:
    """The marked networks of one project, through an openstacksdk connection."""

    def __init__(self, conn: Any, project_id: str, tag: str, subnet_pool: str, router: str) -> None:
        self._conn = conn
        self._project = project_id
        self._tag = tag
        self._pool = subnet_pool
        self._router = router

    @property
    def _net(self) -> Any:
        return self._conn.network

    @_translated("find namespace network")
    def find(self, uid: str) -> NamespaceNetwork | None:
        found = list(
            self._net.networks(project_id=self._project, tags=f"{self._tag},{namespace_mark(uid)}")
        )
        if not found:
            return None
        network = found[0]
        subnets = self._net.subnets(network_id=network.id)
        return NamespaceNetwork(str(network.id), tuple(sorted(str(s.id) for s in subnets)))

    @_translated("make namespace network")
    def ensure(self, namespace: str, uid: str) -> NamespaceNetwork:
        """The namespace's network with its subnet, attached to the router."""
        found = self.find(uid)
        network_id = found.network_id if found is not None else self._create_network(namespace, uid)
        subnets = found.subnet_ids if found is not None else ()
        if not subnets:
            subnets = (self._create_subnet(namespace, network_id),)
        for subnet_id in subnets:
            if not self._attached(network_id, subnet_id):
                self._net.add_interface_to_router(self._router, subnet_id=subnet_id)
        return NamespaceNetwork(network_id, subnets)

    def _create_network(self, namespace: str, uid: str) -> str:
        raw = self._net.create_network(
            name=NAME_PREFIX + namespace,
            description=f"podwire: the network of namespace {namespace} ({uid})",
            project_id=self._project,
        )
        try:
            self._net.set_tags(raw, [self._tag, namespace_mark(uid)])
        except BaseException:  # an unmarked network would be nobody's: removed, then raised
            self._net.delete_network(raw.id, ignore_missing=True)
            raise
        return str(raw.id)

    def _create_subnet(self, namespace: str, network_id: str) -> str:
        pool = self._net.get_subnet_pool(self._pool)
        raw = self._net.create_subnet(
            name=NAME_PREFIX + namespace,
            network_id=network_id,
            subnetpool_id=self._pool,
            ip_version=int(pool.ip_version or 4),
            project_id=self._project,
        )
        return str(raw.id)

    def _attached(self, network_id: str, subnet_id: str) -> bool:
        ports = self._net.ports(device_id=self._router, network_id=network_id)
        return any(
            ip.get("subnet_id") == subnet_id for port in ports for ip in port.fixed_ips or ()
        )

    @_translated("delete namespace network")
    def delete(self, uid: str) -> str | None:
        """Router interfaces, subnets, then the network (the order Neutron accepts); returns
        the network deleted, None when there was none. Repeating it after a failure is safe."""
        found = self.find(uid)
        if found is None:
            return None
        for subnet_id in found.subnet_ids:
            if self._attached(found.network_id, subnet_id):
                self._net.remove_interface_from_router(self._router, subnet_id=subnet_id)
            self._net.delete_subnet(subnet_id, ignore_missing=True)
        self._net.delete_network(found.network_id, ignore_missing=True)
        return found.network_id
