"""The pyroute2 side of the netlink layer: idempotent plumbing on an open ``IPRoute``.

Bridges, VXLAN devices, FDB and neighbour entries, VLANs and taps: not latency critical, and
they need the dumps and attribute parsing pyroute2 offers. Only ``handle.Netlink`` calls these.

``ensure_*`` leave the kernel in the asked-for state whether or not it already was, and
``remove_*`` succeed when the thing is already gone; that is what lets a restarted agent adopt
what it finds without disturbing attached pods.
"""

from __future__ import annotations

import errno
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from podwire.netlink.model import LinkInfo, RemoteMac

FLOOD_MAC = "00:00:00:00:00:00"
VXLAN_PORT = 4789
NTF_SELF, NTF_MASTER = 0x02, 0x04
NUD_NOARP, NUD_PERMANENT = 0x40, 0x80


def _info(msg: Any) -> LinkInfo:
    linkinfo = msg.get("linkinfo")
    kind = linkinfo.get("kind") if linkinfo is not None else None
    data = linkinfo.get("data") if linkinfo is not None else None
    vni = local = learning = proxy = None
    if kind == "vxlan" and data is not None:
        vni = data.get("vxlan_id")
        local = data.get("vxlan_local")
        learning = bool(data.get("vxlan_learning"))
        proxy = bool(data.get("vxlan_proxy"))
    return LinkInfo(
        index=int(msg["index"]),
        name=str(msg.get("ifname")),
        kind=str(kind or ""),
        master=int(msg.get("master") or 0),
        mtu=int(msg.get("mtu") or 0),
        mac=str(msg.get("address") or ""),
        up=bool(msg["flags"] & 1),
        vni=vni,
        vxlan_local=local,
        alias=str(msg.get("ifalias") or ""),
        vxlan_learning=learning,
        vxlan_proxy=proxy,
    )


def get_link(ipr: Any, name: str) -> LinkInfo | None:
    try:
        return _info(ipr.link("get", ifname=name)[0])
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return None
        raise


def remove_link(ipr: Any, name: str) -> bool:
    """Delete ``name``; False when it did not exist. Deleting a veth end removes both ends."""
    try:
        ipr.link("del", ifname=name)
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return False
        raise
    return True


def ensure_bridge(ipr: Any, name: str, mtu: int, mac: str, alias: str) -> LinkInfo:
    """A bridge with the fixed address ``mac``: one that took its ports' lowest address would
    change it as ports come and go, and each change flushes the neighbour entries that answer
    ARP/ND for remote ports (``set_remote_mac``)."""
    link = get_link(ipr, name)
    if link is not None and link.kind != "bridge":
        raise NetlinkError(errno.EEXIST, f"{name} exists and is a {link.kind or 'plain'} link")
    if link is None:
        ipr.link("add", ifname=name, kind="bridge", mtu=mtu, address=mac)
    elif link.mac != mac:
        ipr.link("set", index=link.index, address=mac)
    ipr.link("set", ifname=name, state="up")
    return _marked(ipr, _require(ipr, name), alias)


def ensure_vxlan(ipr: Any, name: str, vni: int, local: str, mtu: int, alias: str) -> LinkInfo:
    """A VXLAN device with this VNI and local VTEP that learns nothing from frames; one with
    other parameters is replaced. Its own ARP/ND proxy stays off: it drops requests for
    addresses it does not know (allowed address pairs, VIPs), where the bridge's neighbour
    suppression answers the known ones and floods the rest (``set_port_learning``).

    Only our own devices carry our names, so replacing a mismatched one cannot hit foreign
    state; the bridge keeps its pods, which only lose flooding for the instant of the swap.
    """
    link = get_link(ipr, name)
    if link is not None and (
        link.kind != "vxlan" or (link.vni, link.vxlan_local) != (vni, local) or link.vxlan_proxy
    ):
        remove_link(ipr, name)  # the kernel cannot change these in place
        link = None
    if link is not None and link.vxlan_learning:
        # A device from before learning was switched off (it carries pods) is changed in place.
        ipr.link("set", index=link.index, kind="vxlan", vxlan_learning=0)
    if link is None:
        ipr.link(
            "add",
            ifname=name,
            kind="vxlan",
            vxlan_id=vni,
            vxlan_local=local,
            vxlan_port=VXLAN_PORT,
            vxlan_learning=0,
            mtu=mtu,
        )
    ipr.link("set", ifname=name, state="up")
    return _marked(ipr, _require(ipr, name), alias)


def ensure_master(ipr: Any, name: str, master: str) -> None:
    """Enslave ``name`` to the bridge ``master`` and bring it up."""
    bridge = _require(ipr, master)
    link = _require(ipr, name)
    if link.master != bridge.index:
        ipr.link("set", index=link.index, master=bridge.index)
    if not link.up:
        ipr.link("set", index=link.index, state="up")


def set_remote_port(ipr: Any, name: str) -> None:
    """The bridge port ``name`` leads to other nodes: the bridge learns no source MAC from
    it, and answers ARP/ND for the addresses in its neighbour table instead of sending the
    request out there (it floods those it does not know)."""
    ipr.brport("set", index=_require(ipr, name).index, learning=0, neigh_suppress=1)


def remote_macs(ipr: Any, name: str, bridge: str) -> dict[str, RemoteMac]:
    """What the VXLAN device ``name`` holds for remote MACs: its own FDB entries with a VTEP
    (the all-zero flood entries aside), with their permanent neighbour entries on ``bridge``."""
    link = _require(ipr, name)
    found: dict[str, tuple[str, set[str]]] = {}
    for entry in ipr.fdb("dump", ifindex=link.index):
        mac, dst = str(entry.get("lladdr") or ""), entry.get("dst")
        if dst and mac and mac != FLOOD_MAC and entry["flags"] & NTF_SELF:
            found[mac] = (str(dst), set())
    for entry in ipr.neigh("dump", ifindex=_require(ipr, bridge).index):
        mac = str(entry.get("lladdr") or "")
        if mac in found and entry["state"] & NUD_PERMANENT:
            found[mac][1].add(str(entry.get("dst")))
    return {mac: RemoteMac(mac, dst, frozenset(ips)) for mac, (dst, ips) in found.items()}


def set_remote_mac(ipr: Any, name: str, bridge: str, remote: RemoteMac) -> None:
    """``remote.mac`` at ``remote.vtep``: a static entry in the bridge towards the device (the
    bridge does not learn on it), one in the device towards the VTEP, and a permanent
    neighbour entry per IP on the bridge for its ARP/ND answers."""
    index, bridge_index = _require(ipr, name).index, _require(ipr, bridge).index
    ipr.fdb("replace", ifindex=index, lladdr=remote.mac, dst=remote.vtep, flags=NTF_SELF,
            state=NUD_PERMANENT)  # fmt: skip
    ipr.fdb("replace", ifindex=index, lladdr=remote.mac, flags=NTF_MASTER, state=NUD_NOARP)
    for ip in sorted(remote.ips):
        ipr.neigh("replace", ifindex=bridge_index, dst=ip, lladdr=remote.mac,
                  state=NUD_PERMANENT)  # fmt: skip


def drop_remote_mac(ipr: Any, name: str, bridge: str, remote: RemoteMac) -> None:
    index, bridge_index = _require(ipr, name).index, _require(ipr, bridge).index
    for ip in sorted(remote.ips):
        _tolerating(MISSING, ipr.neigh, "del", ifindex=bridge_index, dst=ip, lladdr=remote.mac)
    _tolerating(MISSING, ipr.fdb, "del", ifindex=index, lladdr=remote.mac, dst=remote.vtep,
                    flags=NTF_SELF)  # fmt: skip
    _tolerating(MISSING, ipr.fdb, "del", ifindex=index, lladdr=remote.mac, flags=NTF_MASTER)


MISSING = (errno.ENOENT, errno.ENODEV)


def _tolerating(codes: tuple[int, ...], call: Any, *args: Any, **kwargs: Any) -> None:
    """A netlink call whose failure with one of ``codes`` means it is already as wanted."""
    try:
        call(*args, **kwargs)
    except NetlinkError as exc:
        if exc.code not in codes:
            raise


def flood_peers(ipr: Any, name: str) -> set[str]:
    link = _require(ipr, name)
    peers = set()
    for entry in ipr.fdb("dump", ifindex=link.index):
        if entry.get("lladdr") == FLOOD_MAC and entry.get("dst"):
            peers.add(str(entry.get("dst")))
    return peers


def sync_flood(ipr: Any, name: str, peers: set[str]) -> tuple[set[str], set[str]]:
    """Make the all-zero (flood) FDB entries of a VXLAN device exactly ``peers``."""
    current = flood_peers(ipr, name)
    added, removed = peers - current, current - peers
    for dst in sorted(added):
        add_flood(ipr, name, dst)
    for dst in sorted(removed):
        drop_flood(ipr, name, dst)
    return added, removed


def add_flood(ipr: Any, name: str, peer: str) -> None:
    index = _require(ipr, name).index
    _tolerating(
        (errno.EEXIST,),
        ipr.fdb,
        "append",
        ifindex=index,
        lladdr=FLOOD_MAC,
        dst=peer,
        flags=NTF_SELF,
    )


def drop_flood(ipr: Any, name: str, peer: str) -> None:
    index = _require(ipr, name).index
    _tolerating(MISSING, ipr.fdb, "del", ifindex=index, lladdr=FLOOD_MAC, dst=peer, flags=NTF_SELF)


def ensure_vlan(ipr: Any, name: str, parent: str, vlan_id: int, alias: str) -> None:
    """A VLAN device ``name`` of ``parent`` with ``vlan_id``, unless one of that name exists."""
    if get_link(ipr, name) is None:
        parent_link = get_link(ipr, parent)
        index = parent_link.index if parent_link else 0
        ipr.link("add", ifname=name, kind="vlan", link=index, vlan_id=vlan_id)
    _marked(ipr, _require(ipr, name), alias)


def _marked(ipr: Any, link: LinkInfo, alias: str) -> LinkInfo:
    """The link with ``alias`` (set only when it differs: each change is a link event)."""
    if link.alias != alias:
        ipr.link("set", index=link.index, ifalias=alias)
    return link


def add_vlan(
    ipr: Any, name: str, uplink: str, vlan_id: int, mac: str, mtu: int, netns_fd: int
) -> None:
    """Nested mode: a VLAN sub-interface of the uplink, created directly in the pod namespace."""
    parent = _require(ipr, uplink)
    ipr.link(
        "add",
        ifname=name,
        kind="vlan",
        link=parent.index,
        vlan_id=vlan_id,
        address=mac,
        mtu=mtu,
        net_ns_fd=netns_fd,
    )


def pod_addresses(ipr: Any, name: str) -> tuple[LinkInfo, set[str]] | None:
    link = get_link(ipr, name)
    if link is None:
        return None
    found = set()
    for msg in ipr.addr("dump", index=link.index):
        found.add(f"{msg.get('address')}/{msg['prefixlen']}")
    return link, found


def _require(ipr: Any, name: str) -> LinkInfo:
    link = get_link(ipr, name)
    if link is None:
        raise NetlinkError(errno.ENODEV, f"{name}: no such device")
    return link
