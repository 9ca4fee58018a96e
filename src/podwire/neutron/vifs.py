"""The one conversion of a Neutron port into podwire's VIF, with the network facts it needs.

Both the controller (pooled ports) and the agent's ``vif_source = "neutron"`` (a port per
attachment) build VIFs here, so the two cannot drift apart: an unknown subnet is an error, SGs
are sorted, the MAC is lower case and the vif type comes from the binding. The controller caches the
network facts, so building a VIF for a pooled port costs no Neutron call.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from podwire.errors import ValidationError
from podwire.schema.ports import PODWIRE_VIF_TYPES, FixedIp, HostRoute, host_routes
from podwire.schema.vif import Vif

BINDING_FAILED = "binding_failed"


@dataclass(frozen=True)
class Subnet:
    id: str
    cidr: str
    gateway_ip: str | None
    host_routes: tuple[HostRoute, ...] = ()

    @classmethod
    def from_neutron(cls, subnet: Any) -> Subnet:
        """Read through the schema's route reader: a route the agent cannot install must fail
        here, naming the subnet, not in a pod's namespace."""
        version = ipaddress.ip_network(str(subnet.cidr)).version
        routes = host_routes(
            getattr(subnet, "host_routes", None) or [], f"subnet {subnet.id} host_routes", version
        )
        return cls(str(subnet.id), str(subnet.cidr), subnet.gateway_ip or None, routes)


@dataclass(frozen=True)
class NetworkInfo:
    id: str
    project_id: str
    shared: bool
    mtu: int
    network_type: str
    segmentation_id: int | None
    subnets: dict[str, Subnet]
    name: str = ""
    admin_up: bool = True
    physnet: str | None = None  # flat and VLAN networks: the physical network they are on

    @classmethod
    def from_neutron(cls, network: Any, subnets: list[Any]) -> NetworkInfo:
        return cls(
            id=str(network.id),
            project_id=str(network.project_id or ""),
            shared=bool(getattr(network, "is_shared", False)),
            mtu=int(network.mtu or 1500),
            network_type=str(getattr(network, "provider_network_type", None) or "vxlan"),
            segmentation_id=_opt_int(getattr(network, "provider_segmentation_id", None)),
            subnets={str(s.id): Subnet.from_neutron(s) for s in subnets},
            name=str(getattr(network, "name", None) or ""),
            admin_up=getattr(network, "is_admin_state_up", True) is not False,
            physnet=getattr(network, "provider_physical_network", None) or None,
        )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def port_to_vif(port: Any, network: NetworkInfo, vlan_id: int | None = None) -> Vif:
    """Build the agent's VIF from a Neutron port; rejects a port on a subnet we do not know."""
    fixed_ips = []
    for item in port.fixed_ips or []:
        subnet = network.subnets.get(item["subnet_id"])
        if subnet is None:
            raise ValidationError(
                f"port {port.id}: subnet {item['subnet_id']} is not on its network"
            )
        fixed_ips.append(
            FixedIp(
                item["ip_address"], subnet.id, subnet.cidr, subnet.gateway_ip, subnet.host_routes
            )
        )
    vif_type = str(getattr(port, "binding_vif_type", None) or "veth")
    return Vif(
        port_id=str(port.id),
        network_id=network.id,
        project_id=str(port.project_id or ""),
        mac_address=str(port.mac_address).lower(),
        mtu=network.mtu,
        fixed_ips=fixed_ips,
        network_type=network.network_type,
        segmentation_id=network.segmentation_id,
        vif_type=vif_type if vif_type not in ("unbound", "binding_failed") else "veth",
        security_groups=sorted(port.security_group_ids or []),
        vlan_id=vlan_id,
    )


def is_bound(port: Any) -> bool:
    """Bound to a host by podwire's ml2 driver: only such a port can be wired by an agent.

    ``binding_failed`` (ml2 declined the host, e.g. no live agent) and other drivers' vif types
    are not: such a port must never be pooled or handed out.
    """
    return bool(port.binding_host_id) and port.binding_vif_type in PODWIRE_VIF_TYPES


def binding_failed(port: Any) -> bool:
    return bool(port.binding_host_id) and port.binding_vif_type == BINDING_FAILED
