"""Per-network shared plumbing on the host: a bridge plus the uplink the network type needs.

The functions here run on a host netlink worker thread (they take its ``Netlink``); the
plan is computed first, on the loop, so configuration errors surface without touching the
kernel.

Ownership (see ``naming``): the bridge and the VXLAN/VLAN device of a network some desired
port needs are ensured, adopted if they exist already (an agent from before marks made them),
and marked. Only marked links are ever deleted or replaced; a link that has our prefix but
not the mark is someone else's, and is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from podwire.agent import naming
from podwire.errors import PermanentError
from podwire.netlink import Netlink, RemoteMac, announce
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


def ensure_network(
    nl: Netlink, plan: NetworkPlan, peers: set[str], remote: dict[str, RemoteMac]
) -> None:
    """``remote``: for VXLAN, the other nodes' ports of this network (by MAC)."""
    nl.ensure_bridge(plan.bridge, plan.mtu, naming.bridge_mac(plan.bridge), naming.MARK)
    if plan.network_type == "vxlan":
        assert plan.uplink and plan.vtep_ip and plan.segmentation_id is not None
        _check_replaceable(nl, plan.uplink, plan.segmentation_id, plan.vtep_ip)
        nl.ensure_vxlan(plan.uplink, plan.segmentation_id, plan.vtep_ip, plan.mtu, naming.MARK)
    elif plan.network_type == "vlan":
        assert plan.uplink and plan.physical and plan.segmentation_id is not None
        nl.ensure_vlan(plan.uplink, plan.physical, plan.segmentation_id, naming.MARK)
    assert plan.uplink  # flat: the physnet interface itself, which is never ours to mark
    nl.ensure_master(plan.uplink, plan.bridge)
    if plan.network_type == "vxlan":
        # The bridge learns nothing from the VXLAN port either: a frame from another node
        # with some pod's source MAC cannot move that pod's entry (and its traffic) away.
        nl.set_remote_port(plan.uplink)
        sync_peers(nl, plan.uplink, plan.bridge, peers, remote)


def _check_replaceable(nl: Netlink, name: str, vni: int, local: str) -> None:
    """``ensure_vxlan`` replaces a device of our name with other settings: only if it is ours."""
    link = nl.link(name)
    if link is None or naming.is_marked(link.alias):
        return
    if link.kind != "vxlan" or link.vni != vni or link.vxlan_local != local:
        raise UnservableNetwork(
            f"{name} exists with other settings and without podwire's mark"
            f" (alias {naming.MARK!r}): it is not podwire's, so it is not replaced"
        )


def sync_peers(
    nl: Netlink, vxlan_device: str, bridge: str, peers: set[str], remote: dict[str, RemoteMac]
) -> int:
    """Flood entries for ``peers``, and exactly ``remote`` as the device's remote MACs, read
    back from the kernel (a network's first sync, and the drift repair): the local ports hear
    of each new one's addresses by gratuitous ARP. Returns how many entries were changed."""
    if nl.link(vxlan_device) is None or nl.link(bridge) is None:
        return 0
    added, removed = nl.sync_flood(vxlan_device, peers)
    current = nl.remote_macs(vxlan_device, bridge)
    return len(added) + len(removed) + _apply_remote(nl, vxlan_device, bridge, current, remote)


def update_peers(
    nl: Netlink,
    vxlan_device: str,
    bridge: str,
    before: tuple[set[str], dict[str, RemoteMac]],
    after: tuple[set[str], dict[str, RemoteMac]],
) -> None:
    """From what was synced to what is wanted, touching only the difference: a change of
    the other nodes costs its own entries, not a read of all of them."""
    if nl.link(vxlan_device) is None or nl.link(bridge) is None:
        return
    flood_before, flood_after = before[0], after[0]
    for dst in sorted(flood_after - flood_before):
        nl.add_flood(vxlan_device, dst)
    for dst in sorted(flood_before - flood_after):
        nl.drop_flood(vxlan_device, dst)
    _apply_remote(nl, vxlan_device, bridge, before[1], after[1])


def _apply_remote(
    nl: Netlink,
    vxlan_device: str,
    bridge: str,
    current: dict[str, RemoteMac],
    remote: dict[str, RemoteMac],
) -> int:
    changed = 0
    for mac, found in current.items():
        if remote.get(mac) != found:
            nl.drop_remote_mac(vxlan_device, bridge, found)
            changed += 1
    appeared: list[RemoteMac] = []
    for mac, wanted in remote.items():
        if current.get(mac) != wanted:
            nl.set_remote_mac(vxlan_device, bridge, wanted)
            appeared.append(wanted)
    if appeared:
        _announce(nl, vxlan_device, bridge, appeared)
    return changed + len(appeared)


def _announce(nl: Netlink, vxlan_device: str, bridge: str, remotes: list[RemoteMac]) -> None:
    """What neighbour suppression keeps from crossing: the new remote ports' GARPs, to the
    local ports (``netlink.gratuitous``)."""
    local = [p.name for p in nl.bridge_ports(bridge) if p.name != vxlan_device]
    if not local:
        return
    source = naming.bridge_mac(bridge)
    for remote in remotes:
        for ip in sorted(remote.ips):
            announce(local, ip, remote.mac, source)


def pods_on(nl: Netlink, bridge: str) -> list[str]:
    return [link.name for link in nl.bridge_ports(bridge) if naming.is_pod_veth(link.name)]


def remove_network(nl: Netlink, plan: NetworkPlan) -> bool:
    """Remove a network's plumbing unless a pod is still plugged in (then keep it all)."""
    if pods_on(nl, plan.bridge):
        return False
    if plan.network_type in ("vxlan", "vlan") and plan.uplink:
        remove_marked(nl, plan.uplink)
    remove_marked(nl, plan.bridge)  # a flat physnet interface is released with it
    return True


def remove_marked(nl: Netlink, name: str) -> bool:
    """Delete ``name`` only if it carries podwire's mark; False when absent or not ours."""
    link = nl.link(name)
    if link is None or not naming.is_marked(link.alias):
        return False
    return nl.remove_link(name)


@dataclass(frozen=True)
class Sweep:
    removed: list[str]
    foreign: list[str]  # our prefix, no mark: someone else's, left alone


def sweep_unused(nl: Netlink, keep: set[str]) -> Sweep:
    """Remove our bridges (and their VXLAN/VLAN devices) that no desired port needs and no pod
    uses: left behind when ports went away while the agent was down. Bridges named like ours
    without the mark are only reported."""
    sweep = Sweep([], [])
    for link in nl.links():
        ours = link.name.startswith(naming.BRIDGE_PREFIX) and link.kind == "bridge"
        if not ours or link.name in keep:
            continue
        if not naming.is_marked(link.alias):
            sweep.foreign.append(link.name)
            continue
        if pods_on(nl, link.name):
            continue
        suffix = link.name[len(naming.BRIDGE_PREFIX) :]
        for uplink in (naming.VXLAN_PREFIX + suffix, naming.VLAN_PREFIX + suffix):
            remove_marked(nl, uplink)
        nl.remove_link(link.name)
        sweep.removed.append(link.name)
    return sweep
