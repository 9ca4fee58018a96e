"""Desired-port values written straight into etcd, for binder tests that need exact control.

Everything else in tests/agent gets its desired keys from the real ml2 forwarder running in the
stack's Neutron; these tests pin values (a VNI, a physnet, a malformed field) that Neutron would
not produce on demand. The value is podwire.schema.ports'.
"""

from __future__ import annotations

import json
from typing import Any


def desired_value(
    port_id: str,
    network_id: str,
    mac: str,
    fixed_ips: list[dict[str, Any]],
    network_type: str = "vxlan",
    segmentation_id: int | None = 1000,
    physnet: str | None = None,
    mtu: int = 1450,
) -> bytes:
    body = {
        "v": 1,
        "port_id": port_id,
        "network_id": network_id,
        "mac_address": mac,
        "mtu": mtu,
        "network_type": network_type,
        "physnet": physnet,
        "segmentation_id": segmentation_id,
        "vif_type": "veth",
        "vif_details": {},
        "fixed_ips": fixed_ips,
        "security_groups": [],
        "device_owner": "compute:podwire",
        "device_id": "",
        "trunk": None,
    }
    return json.dumps(body).encode()


def value_from_neutron(conn: Any, port: Any) -> bytes:
    network = conn.network.get_network(port.network_id)
    subnets = {s.id: s for s in conn.network.subnets(network_id=port.network_id)}
    fixed = [
        {
            "ip_address": ip["ip_address"],
            "subnet_id": ip["subnet_id"],
            "cidr": subnets[ip["subnet_id"]].cidr,
            "gateway_ip": subnets[ip["subnet_id"]].gateway_ip,
        }
        for ip in port.fixed_ips
    ]
    return desired_value(
        port.id,
        port.network_id,
        port.mac_address,
        fixed,
        network.provider_network_type,
        network.provider_segmentation_id,
        network.provider_physical_network,
        network.mtu,
    )
