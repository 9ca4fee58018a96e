"""Per-network shared plumbing on the host: a bridge plus the uplink the network type needs.

The functions here run on a host netlink worker thread (they take an open ``IPRoute``); the
plan is computed first, on the loop, so configuration errors surface without touching the
kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podwire.agent import naming
from podwire.errors import PermanentError
from podwire.netlink import links
from podwire.schema.ports import DesiredPort


class UnservableNetwork(PermanentError):
    """This host cannot serve the port's network (physnet not mapped, no VTEP, no 8021q)."""


@dataclass(frozen=True)
class NetworkPlan:
    network_id: str
    network_type: str
    bridge: str
    mtu: int
    uplink: str | None  # the device enslaved next to the pods, if any
    segmentation_id: int | None = None
    vtep_ip: str | None = None
    physical: str | None = None  # physnet interface (flat: the uplink itself; vlan: its parent)


def plan_network(
    port: DesiredPort, vtep_ip: str, physnets: dict[str, str], vlan_capable: bool
) -> NetworkPlan:
    bridge = naming.bridge(port.network_id)
    if port.network_type == "vxlan":
        if not vtep_ip:
            raise UnservableNetwork("vxlan port but agent.vtep_ip is not set on this host")
        return NetworkPlan(
            port.network_id,
            "vxlan",
            bridge,
            port.mtu,
            naming.vxlan(port.network_id),
            port.segmentation_id,
            vtep_ip,
        )
    interface = physnets.get(port.physnet or "")
    if interface is None:
        raise UnservableNetwork(
            f"physnet {port.physnet!r} is not in agent.physnet_mappings on this host"
        )
    if port.network_type == "flat":
        return NetworkPlan(port.network_id, "flat", bridge, port.mtu, interface, physical=interface)
    if not vlan_capable:
        raise UnservableNetwork("vlan network but this kernel has no 8021q (VLAN) support")
    return NetworkPlan(
        port.network_id,
        "vlan",
        bridge,
        port.mtu,
        naming.vlan(port.network_id),
        port.segmentation_id,
        physical=interface,
    )


def ensure_network(ipr: Any, plan: NetworkPlan, peers: set[str]) -> None:
    links.ensure_bridge(ipr, plan.bridge, plan.mtu)
    if plan.network_type == "vxlan":
        assert plan.uplink and plan.vtep_ip and plan.segmentation_id is not None
        links.ensure_vxlan(ipr, plan.uplink, plan.segmentation_id, plan.vtep_ip, plan.mtu)
        links.sync_flood(ipr, plan.uplink, peers)
    elif plan.network_type == "vlan":
        assert plan.uplink and plan.physical and plan.segmentation_id is not None
        _ensure_vlan_uplink(ipr, plan.uplink, plan.physical, plan.segmentation_id)
    assert plan.uplink
    links.ensure_master(ipr, plan.uplink, plan.bridge)


def _ensure_vlan_uplink(ipr: Any, name: str, parent: str, vlan_id: int) -> None:
    if links.get_link(ipr, name) is None:
        parent_link = links.get_link(ipr, parent)
        index = parent_link.index if parent_link else 0
        ipr.link("add", ifname=name, kind="vlan", link=index, vlan_id=vlan_id)


def sync_peers(ipr: Any, vxlan_device: str, peers: set[str]) -> None:
    if links.get_link(ipr, vxlan_device) is not None:
        links.sync_flood(ipr, vxlan_device, peers)


def pods_on(ipr: Any, bridge: str) -> list[str]:
    return [link.name for link in links.bridge_ports(ipr, bridge) if naming.is_pod_veth(link.name)]


def remove_network(ipr: Any, plan: NetworkPlan) -> bool:
    """Remove a network's plumbing unless a pod is still plugged in (then keep it all)."""
    if pods_on(ipr, plan.bridge):
        return False
    if plan.network_type in ("vxlan", "vlan") and plan.uplink:
        links.remove_link(ipr, plan.uplink)
    links.remove_link(ipr, plan.bridge)  # a flat physnet interface is released with it
    return True


def sweep_unused(ipr: Any, keep: set[str]) -> list[str]:
    """Remove our bridges (and their VXLAN/VLAN devices) that no desired port needs and no pod
    uses: left behind when ports went away while the agent was down."""
    removed = []
    for link in links.list_links(ipr):
        if not link.name.startswith("pwbr") or link.kind != "bridge" or link.name in keep:
            continue
        if pods_on(ipr, link.name):
            continue
        suffix = link.name[4:]
        for uplink in (f"pwvx{suffix}", f"pwvl{suffix}"):
            links.remove_link(ipr, uplink)
        links.remove_link(ipr, link.name)
        removed.append(link.name)
    return removed
