"""How ports are made for a node: baremetal (bound to the node), nested (trunk subports),
unpooled (a port per request).

Each node gets one driver, chosen from its registration (the optional ``pod_driver`` field of
its capabilities key) or the configured default; drivers are registered under those names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from podwire import keys
from podwire.controller.bindings import settle_bindings
from podwire.controller.errors import BindingFailed
from podwire.controller.neutron_ops import NeutronOps, delete_ports
from podwire.errors import ValidationError
from podwire.etcd.client import EtcdClient
from podwire.log import get_logger
from podwire.neutron.client import NeutronAddressesExhausted
from podwire.neutron.vifs import NetworkInfo, port_to_vif
from podwire.schema.inuse import PoolKey, SgKey
from podwire.schema.nodes import RENAMED_POD_DRIVERS, parse_capabilities
from podwire.schema.vif import DEVICE_OWNER, Vif

log = get_logger(__name__)

AVAILABLE_NAME = "available-port"


class PortDriver(Protocol):
    """Makes and removes the ports of one node kind; ``pooled`` says whether they are reused."""

    name: str
    pooled: bool

    async def create(
        self, key: PoolKey, sgs: SgKey, count: int, network: NetworkInfo
    ) -> list[Vif]: ...

    async def delete(self, key: PoolKey, vifs: list[Vif]) -> None: ...


def port_bodies(
    key: PoolKey, sgs: SgKey, count: int, port_debug: bool, host: bool = True
) -> list[dict[str, Any]]:
    body: dict[str, Any] = {
        "network_id": key.network_id,
        "project_id": key.project_id,
        "device_owner": DEVICE_OWNER,
        "security_group_ids": list(sgs),
        "name": AVAILABLE_NAME if port_debug else "",
    }
    if host:
        body["binding_host_id"] = key.node
    return [dict(body) for _ in range(count)]


class BaremetalDriver:
    """Ports bound to the node itself (``binding:host_id``), so they are wired when handed out."""

    name = "baremetal"
    pooled = True

    def __init__(self, neutron: NeutronOps, port_debug: bool, binding_retries: int = 2) -> None:
        self._neutron = neutron
        self._port_debug = port_debug
        self._binding_retries = binding_retries

    async def create(self, key: PoolKey, sgs: SgKey, count: int, network: NetworkInfo) -> list[Vif]:
        """Only ports whose binding succeeded (see ``bindings``): possibly fewer than asked,
        never none (BindingFailed says why)."""
        bodies = port_bodies(key, sgs, count, self._port_debug)
        try:
            ports = await self._neutron.create_ports(bodies)
        except NeutronAddressesExhausted:
            if count == 1:
                raise
            ports = await self._one_by_one(bodies)  # a bulk create is all or nothing
        bound = await settle_bindings(self._neutron, key.node, ports, self._binding_retries)
        if ports and not bound:
            raise BindingFailed(self._unbound(key.node, network, ports))
        return [port_to_vif(port, network) for port in bound]

    def _unbound(self, node: str, network: NetworkInfo, ports: list[Any]) -> str:
        """Why a creation made nothing, in terms an operator can check."""
        vif_types = ", ".join(sorted({str(p.binding_vif_type) for p in ports}))
        name = f"{network.name} ({network.id})" if network.name else network.id
        physnet = f" on physical network {network.physnet!r}" if network.physnet else ""
        return (
            f"podwire's ml2 driver bound none of the {len(ports)} ports made for node {node} on"
            f" network {name} (binding:vif_type {vif_types}; deleted after"
            f" {self._binding_retries} rebinds): the node's agent must be alive and serve"
            f" {network.network_type} networks{physnet} (its capabilities and physnets under"
            f" {keys.state_node_prefix(node)} say what it serves; the ml2 driver's log says"
            " why it declined)"
        )

    async def _one_by_one(self, bodies: list[dict[str, Any]]) -> list[Any]:
        """As many of the ports as the subnets still have addresses for (at least one)."""
        made: list[Any] = []
        for body in bodies:
            try:
                made += await self._neutron.create_ports([body])
            except NeutronAddressesExhausted:
                if not made:
                    raise
                break
        log.info("pool.addresses_short", network=bodies[0]["network_id"], created=len(made))
        return made

    async def delete(self, key: PoolKey, vifs: list[Vif]) -> None:
        await delete_ports(self._neutron, [v.port_id for v in vifs])


class UnpooledDriver(BaremetalDriver):
    """One port created per request and deleted on release: the baseline pools are measured by."""

    name = "unpooled"
    pooled = False


class NodeDrivers:
    """Resolves a node's driver once (an etcd read) and remembers it."""

    def __init__(
        self,
        etcd: EtcdClient,
        drivers: Mapping[str, PortDriver],
        default_driver: str,
    ) -> None:
        self._etcd = etcd
        self._drivers = drivers
        self._default = _current_name(default_driver)
        self._nodes: dict[str, PortDriver] = {}

    def cached(self, node: str) -> PortDriver | None:
        return self._nodes.get(node)

    def all(self) -> list[PortDriver]:
        return list(self._drivers.values())

    async def for_node(self, node: str) -> PortDriver:
        driver = self._nodes.get(node)
        if driver is None:
            driver = self._drivers[await self._registered_driver(node)]
            self._nodes[node] = driver
        return driver

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)

    async def _registered_driver(self, node: str) -> str:
        kv = await self._etcd.get(keys.state_capabilities(node))
        if kv is None:
            return self._default
        try:
            registered = parse_capabilities(kv.value, kv.key).pod_driver
        except ValidationError as exc:
            log.warning("controller.node.bad_capabilities", node=node, error=str(exc))
            return self._default
        return registered or self._default


def _current_name(pod_driver: str) -> str:
    renamed = RENAMED_POD_DRIVERS.get(pod_driver)
    if renamed is None:
        return pod_driver
    log.warning(
        "controller.config.deprecated",
        key="pool.default_driver",
        value=pod_driver,
        use=renamed,
    )
    return renamed
