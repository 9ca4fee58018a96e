"""The VIF a pod attachment gets: the contract between controller (or noop path) and agent.

It travels as JSON over the controller's VIF API and is recorded in the agent's checkpoint, so
it is parsed strictly: a malformed VIF must be rejected before anything is wired with it.

The VIF API (controller side serves it, agent side calls it; docs/vif-api.md has the same):

- ``POST /v1/nodes/{node}/vifs`` with ``Authorization: Bearer <token of that node>`` and body
  ``{"attachment": "<container_id>.<ifname>", "network": "<network id or name>",
  "project_id": "<id or null>", "security_groups": ["<sg id>", ...],
  "pod": {"namespace": "...", "name": "...", "uid": "..."}}``
  -> 200 ``{"vif": Vif.to_json()}``; idempotent: the same attachment gets the same VIF again.
  -> 503 ``{"error": "...", "retryable": true}`` with ``Retry-After: <s>`` when no port is ready.
  -> 400 malformed body or bad names, 401 missing/unknown token, 403 token of another node,
  404 unknown network/project/SG: ``{"error": "<message naming the problem>"}``.
- ``DELETE /v1/nodes/{node}/vifs/{attachment}`` -> 204, idempotent (unknown attachment too).
- ``GET /v1/nodes/{node}/vifs`` -> 200 ``{"attachments": {"<attachment>": Vif.to_json()}}``
  (the agent's GC and resync use it).
- ``node`` and ``attachment`` are checked with ``keys.check_segment``; the controller records
  in-use attachments at ``keys.vif(node, attachment)`` in etcd.
- Ports handed out have device_owner ``compute:podwire`` and are bound to the node
  (``binding:host_id``); the agent learns what to wire from ``/podwire/nodes/<node>/ports/<id>``
  (written by the ml2 forwarder) and reports ``/podwire/state/nodes/<node>/ports/<id>``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from podwire.errors import ValidationError
from podwire.wire import FixedIp

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class Vif:
    port_id: str
    network_id: str
    project_id: str
    mac_address: str
    mtu: int
    fixed_ips: list[FixedIp]
    network_type: str = "vxlan"
    segmentation_id: int | None = None
    vif_type: str = "veth"
    security_groups: list[str] = field(default_factory=list)
    vlan_id: int | None = None  # nested mode: the subport's VLAN on the node's trunk

    def to_json(self) -> dict[str, Any]:
        return {"v": 1, **asdict(self)}

    @classmethod
    def from_json(cls, raw: Any) -> Vif:
        """Parse and validate; raises ValidationError naming the bad field."""
        if not isinstance(raw, dict):
            raise ValidationError("vif: expected a JSON object")
        if raw.get("v") != 1:
            raise ValidationError(f"vif: unsupported schema version {raw.get('v')!r}")
        try:
            vif = cls(
                port_id=_uuid(raw["port_id"], "port_id"),
                network_id=_uuid(raw["network_id"], "network_id"),
                project_id=_str(raw["project_id"], "project_id"),
                mac_address=_mac(raw["mac_address"]),
                mtu=_int(raw["mtu"], "mtu", 68, 65535),
                fixed_ips=[_fixed_ip(item) for item in _list(raw["fixed_ips"], "fixed_ips")],
                network_type=_str(raw.get("network_type", "vxlan"), "network_type"),
                segmentation_id=_optional_int(raw.get("segmentation_id"), "segmentation_id"),
                vif_type=_str(raw.get("vif_type", "veth"), "vif_type"),
                security_groups=[
                    _str(sg, "security_groups")
                    for sg in _list(raw.get("security_groups", []), "security_groups")
                ],
                vlan_id=_optional_int(raw.get("vlan_id"), "vlan_id", 1, 4094),
            )
        except KeyError as exc:
            raise ValidationError(f"vif: missing field {exc.args[0]}") from exc
        return vif


def _fixed_ip(raw: Any) -> FixedIp:
    if not isinstance(raw, dict):
        raise ValidationError("vif.fixed_ips: each entry must be an object")
    try:
        address = ipaddress.ip_address(_str(raw["ip_address"], "fixed_ips.ip_address"))
        network = ipaddress.ip_network(_str(raw["cidr"], "fixed_ips.cidr"), strict=False)
        gateway = raw.get("gateway_ip")
        if gateway is not None:
            ipaddress.ip_address(_str(gateway, "fixed_ips.gateway_ip"))
    except KeyError as exc:
        raise ValidationError(f"vif.fixed_ips: missing field {exc.args[0]}") from exc
    except ValueError as exc:
        raise ValidationError(f"vif.fixed_ips: {exc}") from exc
    if address not in network:
        raise ValidationError(f"vif.fixed_ips: {address} is not inside {network}")
    return FixedIp(str(address), _str(raw.get("subnet_id", ""), "subnet_id"), str(network), gateway)


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value) > 255:
        raise ValidationError(f"vif.{name}: expected a string of at most 255 characters")
    return value


def _uuid(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _UUID.match(value):
        raise ValidationError(f"vif.{name}: {value!r} is not a UUID")
    return value


def _mac(value: Any) -> str:
    if not isinstance(value, str) or not _MAC.match(value.lower()):
        raise ValidationError(f"vif.mac_address: {value!r} is not a MAC address")
    return value.lower()


def _int(value: Any, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValidationError(f"vif.{name}: expected an integer from {low} to {high}")
    return value


def _optional_int(value: Any, name: str, low: int = 0, high: int = 2**24) -> int | None:
    return None if value is None else _int(value, name, low, high)


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValidationError(f"vif.{name}: expected a list")
    return value
