"""The binding decision (docs/ml2.md), free of Neutron so every rule is unit-testable.

A segment is bound only where the host can serve it *now*: declining leaves the segment to
another mechanism driver, whereas a wrong "yes" would publish a port no agent can wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podwire.ml2.host_cache import HostState
from podwire.schema.ports import VIF_TAP, VIF_VETH, VIF_VHOSTUSER

SUPPORTED_NETWORK_TYPES = ("flat", "vlan", "vxlan")
INFRA_OWNER_PREFIXES = ("network:", "neutron:")
POD_OWNERS = ("compute:podwire", "trunk:subport")


@dataclass(frozen=True)
class Segment:
    id: str
    network_type: str
    physnet: str | None
    segmentation_id: int | None


@dataclass(frozen=True)
class Binding:
    segment: Segment
    vif_type: str
    vif_details: dict[str, Any]


@dataclass(frozen=True)
class Decline:
    """Why no segment was bound; logged so an operator sees which check failed."""

    reason: str


def vif_for(
    device_owner: str, port_id: str, host: HostState, vhostuser_dir: str
) -> tuple[str, dict[str, Any]]:
    if device_owner.startswith(INFRA_OWNER_PREFIXES):
        return VIF_TAP, {}
    if device_owner in POD_OWNERS:
        return VIF_VETH, {}
    caps = host.capabilities
    if caps is not None and VIF_VHOSTUSER in caps.vif_types:
        socket = f"{vhostuser_dir.rstrip('/')}/pw-{port_id[:14]}"
        return VIF_VHOSTUSER, {"vhostuser_socket": socket, "vhostuser_mode": "server"}
    return VIF_TAP, {}


def _segment_problem(segment: Segment, host: HostState) -> str | None:
    if segment.network_type not in SUPPORTED_NETWORK_TYPES:
        return f"network type {segment.network_type} not supported"
    caps = host.capabilities
    if caps is not None and segment.network_type not in caps.network_types:
        return f"host does not serve network type {segment.network_type}"
    if segment.network_type == "vxlan":
        return None if host.vtep else "host reports no VTEP"
    if not segment.physnet or segment.physnet not in host.physnets:
        return f"host does not serve physnet {segment.physnet}"
    return None


def decide(
    vnic_type: str,
    device_owner: str,
    port_id: str,
    segments: list[Segment],
    host: HostState,
    vhostuser_dir: str,
) -> Binding | Decline:
    """The first segment the host can serve, with the vif type for this owner and host."""
    if vnic_type != "normal":
        return Decline(f"vnic type {vnic_type} not supported")
    if not host.alive:
        return Decline(f"host {host.host} is not alive")
    vif_type, details = vif_for(device_owner, port_id, host, vhostuser_dir)
    caps = host.capabilities
    if caps is not None and vif_type not in caps.vif_types:
        return Decline(f"host does not serve vif type {vif_type}")
    problems = []
    for segment in segments:
        problem = _segment_problem(segment, host)
        if problem is None:
            return Binding(segment, vif_type, details)
        problems.append(f"{segment.id}: {problem}")
    return Decline("; ".join(problems) or "no segment to bind")
