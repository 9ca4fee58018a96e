"""The desired-port value the agent reads from ``/podwire/nodes/<host>/ports/<id>`` (§2).

Parsed strictly for the fields wiring needs and tolerant of extra fields, because the
forwarder may be upgraded before the agent.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any

from podwire.errors import ValidationError

NETWORK_TYPES = ("flat", "vlan", "vxlan")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


@dataclass(frozen=True)
class PortAddress:
    ip_address: str
    cidr: str
    gateway_ip: str | None

    @property
    def interface(self) -> str:
        """``ip/prefixlen`` as an address on the pod interface."""
        return f"{self.ip_address}/{ipaddress.ip_network(self.cidr).prefixlen}"


@dataclass(frozen=True)
class DesiredPort:
    port_id: str
    network_id: str
    mac_address: str
    mtu: int
    network_type: str
    physnet: str | None
    segmentation_id: int | None
    fixed_ips: tuple[PortAddress, ...]
    trunk_vlan: int | None


def parse_desired(raw: bytes, port_id: str) -> DesiredPort:
    """Decode and check one value; ValidationError names the bad field."""
    what = f"desired port {port_id}"
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{what}: not JSON: {exc}") from exc
    if not isinstance(value, dict) or value.get("v") != 1:
        raise ValidationError(f"{what}: expected an object with schema v=1")
    if value.get("port_id") != port_id:
        raise ValidationError(f"{what}: port_id {value.get('port_id')!r} does not match its key")
    network_type = _str(value, "network_type", what)
    if network_type not in NETWORK_TYPES:
        raise ValidationError(
            f"{what}: network_type {network_type!r} is not one of flat/vlan/vxlan"
        )
    segmentation_id = _opt_int(value.get("segmentation_id"), "segmentation_id", what)
    physnet = value.get("physnet")
    if network_type in ("vxlan", "vlan") and segmentation_id is None:
        raise ValidationError(f"{what}: {network_type} needs a segmentation_id")
    if network_type in ("flat", "vlan") and not isinstance(physnet, str):
        raise ValidationError(f"{what}: {network_type} needs a physnet")
    mac = _str(value, "mac_address", what).lower()
    if not _MAC.match(mac):
        raise ValidationError(f"{what}: mac_address {mac!r} is not a MAC address")
    mtu = _opt_int(value.get("mtu"), "mtu", what)
    if mtu is None or not 68 <= mtu <= 65535:
        raise ValidationError(f"{what}: mtu must be an integer from 68 to 65535")
    return DesiredPort(
        port_id=port_id,
        network_id=_str(value, "network_id", what),
        mac_address=mac,
        mtu=mtu,
        network_type=network_type,
        physnet=physnet if isinstance(physnet, str) else None,
        segmentation_id=segmentation_id,
        fixed_ips=tuple(_address(item, what) for item in _list(value, "fixed_ips", what)),
        trunk_vlan=_trunk_vlan(value.get("trunk"), what),
    )


def _address(raw: Any, what: str) -> PortAddress:
    if not isinstance(raw, dict):
        raise ValidationError(f"{what}: fixed_ips entries must be objects")
    try:
        ip = ipaddress.ip_address(raw["ip_address"])
        net = ipaddress.ip_network(raw["cidr"], strict=False)
        gateway = raw.get("gateway_ip")
        if gateway is not None:
            gateway = str(ipaddress.ip_address(gateway))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValidationError(f"{what}: bad fixed_ips entry {raw!r}: {exc}") from exc
    if ip not in net:
        raise ValidationError(f"{what}: {ip} is not inside {net}")
    return PortAddress(str(ip), str(net), gateway)


def _trunk_vlan(raw: Any, what: str) -> int | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValidationError(f"{what}: trunk must be an object or null")
    return _opt_int(raw.get("segmentation_id"), "trunk.segmentation_id", what)


def _str(value: dict[str, Any], field: str, what: str) -> str:
    item = value.get(field)
    if not isinstance(item, str) or not item or len(item) > 255:
        raise ValidationError(f"{what}: {field} must be a non-empty string")
    return item


def _opt_int(item: Any, field: str, what: str) -> int | None:
    if item is None:
        return None
    if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < 2**24:
        raise ValidationError(f"{what}: {field} must be an integer from 0 to 2^24-1")
    return item


def _list(value: dict[str, Any], field: str, what: str) -> list[Any]:
    items = value.get(field)
    if not isinstance(items, list):
        raise ValidationError(f"{what}: {field} must be a list")
    return items
