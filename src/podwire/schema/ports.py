"""The desired binding of one port, ``/podwire/nodes/<host>/ports/<port_id>``.

Written only by the ml2 forwarder (``DesiredPort.encode``) and read by the node's agent, the
controller's mirror recovery and ``podwire status`` through ``parse_desired_port``: one reader,
so every component agrees on what a usable value is. Everything an agent needs to wire the port
is in it, resolved inside the port's own transaction, because agents have no Neutron access.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from podwire.errors import ValidationError
from podwire.schema import doc, fields

# The vif types podwire's ml2 driver binds with; a port bound with any other type (or
# ``binding_failed``) was not bound for a podwire agent and cannot be wired by one.
VIF_TAP = "tap"
VIF_VETH = "veth"
VIF_VHOSTUSER = "vhostuser"
PODWIRE_VIF_TYPES = (VIF_TAP, VIF_VETH, VIF_VHOSTUSER)

# The host device of a port of vif type tap, as Nova and os-vif name it (and QEMU/libvirt and
# podwire's interface driver make it): "tap" + the port id's first 11 characters.
TAP_PREFIX = "tap"
TAP_NAME_LENGTH = 14


def tap_name(port_id: str) -> str:
    return (TAP_PREFIX + port_id)[:TAP_NAME_LENGTH]


def is_tap_name(name: str) -> bool:
    return name.startswith(TAP_PREFIX) and len(name) == TAP_NAME_LENGTH


MAX_FIXED_IPS = 32
MAX_HOST_ROUTES = 20  # Neutron's max_subnet_host_routes default
MAX_SECURITY_GROUPS = 64
MAX_ADDRESS_PAIRS = 64
MAX_VIF_DETAILS = 4096


@dataclass(frozen=True)
class HostRoute:
    """A subnet's extra route (Neutron's ``host_routes``): ``destination`` via ``nexthop``."""

    destination: str
    nexthop: str

    def to_dict(self) -> dict[str, str]:
        return {"destination": self.destination, "nexthop": self.nexthop}


@dataclass(frozen=True)
class FixedIp:
    ip_address: str
    subnet_id: str
    cidr: str
    gateway_ip: str | None
    host_routes: tuple[HostRoute, ...] = ()

    @property
    def interface(self) -> str:
        """``ip/prefixlen`` as an address on the pod interface."""
        return f"{self.ip_address}/{ipaddress.ip_network(self.cidr).prefixlen}"

    def to_dict(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "ip_address": self.ip_address,
            "subnet_id": self.subnet_id,
            "cidr": self.cidr,
            "gateway_ip": self.gateway_ip,
        }
        if self.host_routes:  # only then: values without routes stay as they were written
            value["host_routes"] = [route.to_dict() for route in self.host_routes]
        return value


@dataclass(frozen=True)
class AddressPair:
    """An allowed address pair: the port may also send from ``ip_address`` (a CIDR; a host
    address is /32 or /128) with ``mac_address`` (Neutron fills in the port's own MAC)."""

    ip_address: str
    mac_address: str

    def to_dict(self) -> dict[str, Any]:
        return {"ip_address": self.ip_address, "mac_address": self.mac_address}


@dataclass(frozen=True)
class TrunkInfo:
    parent_port_id: str
    segmentation_type: str
    segmentation_id: int


@dataclass(frozen=True)
class DesiredPort:
    port_id: str
    network_id: str
    mac_address: str
    mtu: int
    network_type: str
    physnet: str | None
    segmentation_id: int | None
    vif_type: str
    fixed_ips: tuple[FixedIp, ...]
    security_groups: tuple[str, ...] = ()
    device_owner: str = ""
    device_id: str = ""
    trunk: TrunkInfo | None = None
    # Lets a controller rebuild its pools from these values alone (older writers omit it).
    project_id: str | None = None
    vif_details: dict[str, Any] = field(default_factory=dict)
    # Enforcement (docs/security-groups.md). Writers before policy forwarding omit both: such a
    # value means "port security on, no pairs", which is Neutron's default.
    port_security_enabled: bool = True
    allowed_address_pairs: tuple[AddressPair, ...] = ()

    @property
    def filtered(self) -> bool:
        """Whether the port's traffic is filtered (security groups, anti-spoofing): not with
        port security off, and not for Neutron's own agents' ports (device owner
        ``network:*``, DHCP and routers), which Neutron trusts: a router forwards frames
        whose addresses are other ports'."""
        return self.port_security_enabled and not self.device_owner.startswith("network:")

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": doc.SCHEMA_VERSION,
            "port_id": self.port_id,
            "network_id": self.network_id,
            "mac_address": self.mac_address,
            "mtu": self.mtu,
            "network_type": self.network_type,
            "physnet": self.physnet,
            "segmentation_id": self.segmentation_id,
            "vif_type": self.vif_type,
            "vif_details": dict(self.vif_details),
            "fixed_ips": [ip.to_dict() for ip in self.fixed_ips],
            "security_groups": list(self.security_groups),
            "device_owner": self.device_owner,
            "device_id": self.device_id,
            "project_id": self.project_id,
            "port_security_enabled": self.port_security_enabled,
            "allowed_address_pairs": [pair.to_dict() for pair in self.allowed_address_pairs],
            "trunk": None
            if self.trunk is None
            else {
                "parent_port_id": self.trunk.parent_port_id,
                "segmentation_type": self.trunk.segmentation_type,
                "segmentation_id": self.trunk.segmentation_id,
            },
        }

    def encode(self) -> str:
        # Byte-equal for equal bindings, which is how the forwarder detects no-op updates.
        return doc.encode(self.to_dict()).decode()


def parse_desired_port(raw: bytes | str, port_id: str | None = None) -> DesiredPort:
    """Decode and check one value; ``port_id`` is the id in its key, which must match."""
    what = f"desired port {port_id}" if port_id else "desired port"
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    found = obj.req("port_id", fields.uuid)
    if port_id is not None and found != port_id:
        raise ValidationError(f"{what}: port_id {found!r} does not match its key")
    network_type = obj.req("network_type", fields.network_type)
    physnet = obj.maybe("physnet", fields.name)
    segmentation_id = _segmentation(obj, network_type, physnet)
    return DesiredPort(
        port_id=found,
        network_id=obj.req("network_id", fields.uuid),
        mac_address=obj.req("mac_address", fields.mac),
        mtu=obj.req("mtu", fields.mtu),
        network_type=network_type,
        physnet=physnet,
        segmentation_id=segmentation_id,
        vif_type=obj.req("vif_type", _vif_type),
        fixed_ips=tuple(obj.req("fixed_ips", fixed_ips)),
        security_groups=tuple(obj.opt("security_groups", _security_groups, [])),
        device_owner=obj.opt("device_owner", fields.text, ""),
        device_id=obj.opt("device_id", fields.text, ""),
        trunk=_trunk(obj.obj("trunk")),
        project_id=obj.maybe("project_id", fields.project_id),
        vif_details=obj.opt("vif_details", _vif_details, {}),
        port_security_enabled=obj.opt("port_security_enabled", fields.boolean, True),
        allowed_address_pairs=tuple(obj.opt("allowed_address_pairs", _address_pairs, [])),
    )


def _vif_type(value: Any, what: str) -> str:
    return fields.text(value, what, 64, empty=False)


def _segmentation(obj: doc.Obj, network_type: str, physnet: str | None) -> int | None:
    what = obj.what
    if network_type in ("flat", "vlan") and physnet is None:
        raise ValidationError(f"{what}: a {network_type} network needs a physnet")
    if network_type == "flat":
        if obj.value.get("segmentation_id") is not None:
            raise ValidationError(f"{what}: a flat network has no segmentation_id")
        return None
    if obj.value.get("segmentation_id") is None:
        raise ValidationError(f"{what}: a {network_type} network needs a segmentation_id")
    check = fields.vni if network_type == "vxlan" else fields.vlan_id
    return obj.req("segmentation_id", check)


def fixed_ip(value: Any, what: str) -> FixedIp:
    """One address of a port with its subnet; the gateway is of the same family."""
    obj = doc.Obj(doc.as_object(value, what), what)
    address = obj.req("ip_address", fields.host_address)
    network = obj.req("cidr", lambda v, w: fields.cidr(v, w, address.version))
    if address not in network:
        raise ValidationError(f"{what}: {address} is not inside {network}")
    gateway = obj.maybe("gateway_ip", lambda v, w: fields.host_address(v, w, address.version))
    return FixedIp(
        str(address),
        obj.opt("subnet_id", fields.name, ""),
        str(network),
        None if gateway is None else str(gateway),
        obj.opt("host_routes", lambda v, w: host_routes(v, w, address.version), ()),
    )


def host_routes(value: Any, what: str, version: int) -> tuple[HostRoute, ...]:
    """A subnet's host routes, each of the address family ``version`` (Neutron's shape)."""

    def route(item: Any, where: str) -> HostRoute:
        obj = doc.Obj(doc.closed_object(item, where, ROUTE_FIELDS), where)
        return HostRoute(
            str(obj.req("destination", lambda v, w: fields.cidr(v, w, version))),
            str(obj.req("nexthop", lambda v, w: fields.host_address(v, w, version))),
        )

    return tuple(fields.each(value, what, route, MAX_HOST_ROUTES))


ROUTE_FIELDS = frozenset({"destination", "nexthop"})


def fixed_ips(value: Any, what: str) -> list[FixedIp]:
    return fields.each(value, what, fixed_ip, MAX_FIXED_IPS)


def _address_pair(value: Any, what: str) -> AddressPair:
    obj = doc.Obj(doc.as_object(value, what), what)
    return AddressPair(
        obj.req("ip_address", fields.address_or_prefix),
        obj.req("mac_address", fields.mac),
    )


def _address_pairs(value: Any, what: str) -> list[AddressPair]:
    return fields.each(value, what, _address_pair, MAX_ADDRESS_PAIRS)


def _security_groups(value: Any, what: str) -> list[str]:
    return fields.each(value, what, fields.neutron_id, MAX_SECURITY_GROUPS)


def _trunk(obj: doc.Obj | None) -> TrunkInfo | None:
    if obj is None:
        return None
    return TrunkInfo(
        obj.req("parent_port_id", fields.uuid),
        obj.req("segmentation_type", lambda v, w: fields.one_of(v, w, ("vlan",))),
        obj.req("segmentation_id", fields.vlan_id),
    )


def _vif_details(value: Any, what: str) -> dict[str, Any]:
    details = doc.as_object(value, what)
    if len(doc.encode(details)) > MAX_VIF_DETAILS:
        raise ValidationError(f"{what}: larger than {MAX_VIF_DETAILS} bytes")
    return details
