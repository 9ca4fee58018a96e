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
    security_groups: tuple[str, ...] = (),
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
        "security_groups": list(security_groups),
        "device_owner": "compute:podwire",
        "device_id": "",
        "trunk": None,
    }
    return json.dumps(body).encode()
