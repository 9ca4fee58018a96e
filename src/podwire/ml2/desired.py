"""Builds the desired binding of a port from ML2's view of it, inside the port's transaction.

Everything an agent needs to wire the port without asking Neutron is resolved here (network
MTU, subnet CIDR and gateway, trunk parent and VLAN), because agents have no Neutron access.
"""

from __future__ import annotations

from typing import Any

from neutron.objects import trunk as trunk_objects
from neutron_lib.plugins.ml2 import api

from podwire.ml2.policy import address_pairs
from podwire.schema.ports import DesiredPort, FixedIp, HostRoute, TrunkInfo

DRIVER_NAME = "podwire"


def bound_segment(levels: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The segment podwire bound, or None when the port is not (or not by us) bound."""
    if not levels:
        return None
    last = levels[-1]
    if last.get(api.BOUND_DRIVER) != DRIVER_NAME:
        return None
    segment: dict[str, Any] | None = last.get(api.BOUND_SEGMENT)
    return segment


def _trunk(plugin_context: Any, port_id: str) -> TrunkInfo | None:
    subport = trunk_objects.SubPort.get_object(plugin_context, port_id=port_id)
    if subport is None:
        return None
    trunk = trunk_objects.Trunk.get_object(plugin_context, id=subport.trunk_id)
    if trunk is None:
        return None
    return TrunkInfo(trunk.port_id, str(subport.segmentation_type), int(subport.segmentation_id))


def _fixed_ips(context: Any, port: dict[str, Any]) -> tuple[FixedIp, ...]:
    subnet_ids = sorted({ip["subnet_id"] for ip in port.get("fixed_ips") or []})
    subnets: dict[str, dict[str, Any]] = {}
    if subnet_ids:
        found = context._plugin.get_subnets(
            context.plugin_context,
            filters={"id": subnet_ids},
            fields=["id", "cidr", "gateway_ip", "host_routes"],
        )
        subnets = {subnet["id"]: subnet for subnet in found}
    result = []
    for ip in port.get("fixed_ips") or []:
        subnet = subnets.get(ip["subnet_id"], {})
        routes = tuple(
            HostRoute(str(route["destination"]), str(route["nexthop"]))
            for route in subnet.get("host_routes") or []
        )
        result.append(
            FixedIp(
                ip["ip_address"],
                ip["subnet_id"],
                subnet.get("cidr", ""),
                subnet.get("gateway_ip"),
                routes,
            )
        )
    return tuple(result)


def desired_port(
    context: Any, port: dict[str, Any], segment: dict[str, Any], vif_type: str, details: Any
) -> DesiredPort:
    network = context.network.current
    segmentation_id = segment.get(api.SEGMENTATION_ID)
    return DesiredPort(
        port_id=port["id"],
        network_id=port["network_id"],
        mac_address=port["mac_address"],
        mtu=int(network.get("mtu") or 0),
        network_type=segment[api.NETWORK_TYPE],
        physnet=segment.get(api.PHYSICAL_NETWORK),
        segmentation_id=None if segmentation_id is None else int(segmentation_id),
        vif_type=vif_type,
        vif_details=dict(details or {}),
        fixed_ips=_fixed_ips(context, port),
        security_groups=tuple(sorted(port.get("security_groups") or [])),
        device_owner=port.get("device_owner") or "",
        device_id=port.get("device_id") or "",
        trunk=_trunk(context.plugin_context, port["id"]),
        project_id=port.get("project_id") or port.get("tenant_id") or None,
        # Absent when the port-security extension is off: Neutron then enforces nothing either
        # way, and the agent's default (on) with no groups denies, as Neutron's agents do.
        port_security_enabled=bool(port.get("port_security_enabled", True)),
        allowed_address_pairs=address_pairs(port),
    )
