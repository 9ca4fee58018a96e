"""The JSON values on the wire between Neutron and the agents (DESIGN §2), schema ``"v": 1``.

Agents and servers upgrade separately, so a reader accepts unknown fields and rejects, with a
``ValidationError`` naming the problem, anything it cannot use: a bad value is logged and
skipped by the caller, never allowed to crash a watcher or reach Neutron.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

from podwire.errors import ValidationError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class FixedIp:
    ip_address: str
    subnet_id: str
    cidr: str
    gateway_ip: str | None


@dataclass(frozen=True)
class TrunkInfo:
    parent_port_id: str
    segmentation_type: str
    segmentation_id: int


@dataclass(frozen=True)
class DesiredPort:
    """What the forwarder publishes under ``/podwire/nodes/<host>/ports/<id>``."""

    port_id: str
    network_id: str
    mac_address: str
    mtu: int
    network_type: str
    physnet: str | None
    segmentation_id: int | None
    vif_type: str
    vif_details: dict[str, Any]
    fixed_ips: tuple[FixedIp, ...]
    security_groups: tuple[str, ...]
    device_owner: str
    device_id: str
    trunk: TrunkInfo | None
    # Lets a controller rebuild its pools from these values alone (older writers omit it).
    project_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": SCHEMA_VERSION,
            "port_id": self.port_id,
            "network_id": self.network_id,
            "mac_address": self.mac_address,
            "mtu": self.mtu,
            "network_type": self.network_type,
            "physnet": self.physnet,
            "segmentation_id": self.segmentation_id,
            "vif_type": self.vif_type,
            "vif_details": dict(self.vif_details),
            "fixed_ips": [
                {
                    "ip_address": ip.ip_address,
                    "subnet_id": ip.subnet_id,
                    "cidr": ip.cidr,
                    "gateway_ip": ip.gateway_ip,
                }
                for ip in self.fixed_ips
            ],
            "security_groups": list(self.security_groups),
            "device_owner": self.device_owner,
            "device_id": self.device_id,
            "project_id": self.project_id,
            "trunk": None
            if self.trunk is None
            else {
                "parent_port_id": self.trunk.parent_port_id,
                "segmentation_type": self.trunk.segmentation_type,
                "segmentation_id": self.trunk.segmentation_id,
            },
        }

    def encode(self) -> str:
        # Sorted keys make equal bindings byte-equal, which is how no-op updates are detected.
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class AliveValue:
    started_at: float
    version: str


@dataclass(frozen=True)
class Capabilities:
    vif_types: frozenset[str]
    network_types: frozenset[str]


def load_object(raw: bytes | str, what: str) -> dict[str, Any]:
    """Decode a JSON object carrying a schema version this reader understands."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{what}: not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValidationError(f"{what}: expected a JSON object, got {type(value).__name__}")
    version = value.get("v")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise ValidationError(f"{what}: unsupported schema version {version!r}")
    return value


def _str(value: dict[str, Any], field: str, what: str) -> str:
    item = value.get(field)
    if not isinstance(item, str) or not item:
        raise ValidationError(f"{what}: field {field!r} must be a non-empty string")
    return item


def _number(value: dict[str, Any], field: str, what: str) -> float:
    item = value.get(field)
    if isinstance(item, bool) or not isinstance(item, int | float) or item < 0:
        raise ValidationError(f"{what}: field {field!r} must be a non-negative number")
    return float(item)


def _str_list(value: dict[str, Any], field: str, what: str) -> frozenset[str]:
    items = value.get(field)
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        raise ValidationError(f"{what}: field {field!r} must be a list of strings")
    return frozenset(items)


def parse_alive(raw: bytes, what: str = "alive") -> AliveValue:
    value = load_object(raw, what)
    version = value.get("version", "")
    return AliveValue(_number(value, "started_at", what), str(version))


def parse_physnet(raw: bytes, what: str = "physnet") -> str:
    value = load_object(raw, what)
    return _str(value, "interface", what)


def parse_vtep(raw: bytes, what: str = "vtep") -> str:
    value = load_object(raw, what)
    ip = _str(value, "ip", what)
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError as exc:
        raise ValidationError(f"{what}: {ip!r} is not an IP address") from exc


def parse_capabilities(raw: bytes, what: str = "capabilities") -> Capabilities:
    value = load_object(raw, what)
    return Capabilities(
        _str_list(value, "vif_types", what), _str_list(value, "network_types", what)
    )


def parse_port_state(raw: bytes, what: str = "port state") -> float:
    """The time the agent wired the port; validation is the point, the value is informative."""
    return _number(load_object(raw, what), "wired_at", what)


def parse_desired_port(raw: bytes | str, what: str = "desired port") -> dict[str, Any]:
    """Check the fields every agent relies on; returns the decoded object."""
    value = load_object(raw, what)
    for field in ("port_id", "network_id", "mac_address", "network_type", "vif_type"):
        _str(value, field, what)
    if isinstance(value.get("mtu"), bool) or not isinstance(value.get("mtu"), int):
        raise ValidationError(f"{what}: field 'mtu' must be an integer")
    if not isinstance(value.get("fixed_ips"), list):
        raise ValidationError(f"{what}: field 'fixed_ips' must be a list")
    return value


def alive_value(started_at: float, version: str) -> bytes:
    return json.dumps({"v": SCHEMA_VERSION, "started_at": started_at, "version": version}).encode()


def physnet_value(interface: str) -> bytes:
    return json.dumps({"v": SCHEMA_VERSION, "interface": interface}).encode()


def vtep_value(ip: str) -> bytes:
    return json.dumps({"v": SCHEMA_VERSION, "ip": ip}).encode()


def capabilities_value(vif_types: list[str], network_types: list[str]) -> bytes:
    body = {"v": SCHEMA_VERSION, "vif_types": vif_types, "network_types": network_types}
    return json.dumps(body).encode()


def port_state_value(wired_at: float) -> bytes:
    return json.dumps({"v": SCHEMA_VERSION, "wired_at": wired_at}).encode()


# The vif types podwire's ml2 driver binds with; a port bound with any other type (or
# ``binding_failed``) was not bound for a podwire agent and cannot be wired by one.
VIF_TAP = "tap"
VIF_VETH = "veth"
VIF_VHOSTUSER = "vhostuser"
PODWIRE_VIF_TYPES = (VIF_TAP, VIF_VETH, VIF_VHOSTUSER)
