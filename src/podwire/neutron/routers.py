"""A project's floating IPs and routers removed through Neutron's API, in the order it accepts.

Neutron refuses to delete a port a router owns, a router with interfaces, or a network with a
router's port on it: whoever tears a project down (the demo, the tests, the benches) removes
floating IPs, then each router's gateway and interfaces, then the router, and only then ports
and networks.
"""

from __future__ import annotations

from typing import Any

ROUTER_INTERFACE = "network:router_interface"


def delete_routers(conn: Any, project: str) -> None:
    """``conn``: an openstacksdk connection."""
    net = conn.network
    for floating_ip in list(net.ips(project_id=project)):
        net.delete_ip(floating_ip)
    for router in list(net.routers(project_id=project)):
        if router.external_gateway_info:
            net.update_router(router, external_gateway_info=None)
        for port in list(net.ports(device_id=router.id, device_owner=ROUTER_INTERFACE)):
            net.remove_interface_from_router(router, port_id=port.id)
        net.delete_router(router)
