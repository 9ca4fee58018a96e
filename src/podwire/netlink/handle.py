"""The one netlink API: a namespace's links, addresses, routes and plumbing as jobs see them.

A job (run by ``nsexec`` on a worker sitting in a namespace) gets a ``Netlink`` and calls
its methods; which library serves each call is decided here, by measurement. The CNI hot
path (veth, addresses, routes, link lookups and dumps, deletes) goes over the lean packer in
``rtnl``: pyroute2 built and parsed each of those messages through layers of objects and
was most of an ADD's CPU (under a burst of 30 pods on two cores, most of its latency).
Bridges, VXLAN, FDB and neighbour entries, VLANs and taps go over pyroute2 (``links``): not
latency critical, many more message kinds. Both sockets are opened on first use, inside
the handle's namespace: a netlink socket stays in the namespace it was opened in, so a
handle for a pod's namespace enters it for the open and returns the thread home at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pyroute2 import IPRoute

from podwire.netlink import links, tap
from podwire.netlink.model import LinkInfo, RemoteMac
from podwire.netlink.netns import go_home, setns
from podwire.netlink.rtnl import Rtnl, VethSpec

T = TypeVar("T")


class Netlink:
    """One namespace's netlink sockets, opened on demand; not thread-safe (one per worker).

    ``netns_fd``: the namespace, when it is not the calling thread's; ``home``: where the
    thread returns after entering it (the worker's own namespace)."""

    def __init__(self, netns_fd: int | None = None, home: int | None = None) -> None:
        self._netns_fd = netns_fd
        self._home = home
        self._lean: Rtnl | None = None
        self._full: Any = None

    def _open(self, factory: Callable[[], T]) -> T:
        if self._netns_fd is None:
            return factory()
        assert self._home is not None
        setns(self._netns_fd)
        try:
            return factory()
        finally:
            go_home(self._home)

    @property
    def _rtnl(self) -> Rtnl:
        if self._lean is None:
            self._lean = self._open(Rtnl)
        return self._lean

    @property
    def _ipr(self) -> Any:
        if self._full is None:
            self._full = self._open(IPRoute)
        return self._full

    def in_netns(self, netns_fd: int) -> Netlink:
        """A handle for the namespace ``netns_fd`` refers to (a pod's); the caller closes it
        and keeps ``netns_fd`` open meanwhile."""
        assert self._home is not None, "only a host worker's handle enters other namespaces"
        return Netlink(netns_fd, self._home)

    def close(self) -> None:
        if self._lean is not None:
            self._lean.close()
        if self._full is not None:
            self._full.close()
        self._lean = self._full = None

    # --- links: the hot path (lean) ---------------------------------------------------------

    def link(self, name: str) -> LinkInfo | None:
        return self._rtnl.link(name)

    def links(self) -> list[LinkInfo]:
        return self._rtnl.links()

    def link_index(self, name: str) -> int | None:
        return self._rtnl.link_index(name)

    def require_index(self, name: str) -> int:
        """The link's index; ``RtnlError`` (ENODEV) when there is none."""
        return self._rtnl.require_index(name)

    def remove_link(self, name: str) -> bool:
        """Delete ``name`` (a veth end takes its peer along); False when it did not exist."""
        return self._rtnl.delete_link(name)

    def set_alias(self, name: str, alias: str) -> None:
        self._rtnl.set_alias(name, alias)

    def add_veth(self, spec: VethSpec) -> None:
        """``RtnlError`` (EEXIST) when one of its names is taken."""
        self._rtnl.add_veth(spec)

    def set_up(self, index: int) -> None:
        self._rtnl.set_up(index)

    def set_link(self, index: int, mtu: int | None = None, master: int | None = None) -> None:
        """MTU and bridge (``master`` 0: out of any bridge) in one request."""
        self._rtnl.set_link(index, mtu=mtu, master=master)

    def add_address(self, index: int, address: str) -> None:
        self._rtnl.add_address(index, address)

    def add_route(self, index: int, gateway: str, destination: str | None = None) -> None:
        self._rtnl.add_route(index, gateway, destination)

    def bridge_ports(self, bridge: str) -> list[LinkInfo]:
        master = self.link(bridge)
        if master is None:
            return []
        return [link for link in self.links() if link.master == master.index]

    # --- plumbing (pyroute2) ----------------------------------------------------------------

    # ``ensure_*`` leave the device as asked whether or not it was, marked with ``alias``.

    def ensure_bridge(self, name: str, mtu: int, mac: str, alias: str) -> None:
        links.ensure_bridge(self._ipr, name, mtu, mac, alias)

    def ensure_vxlan(self, name: str, vni: int, local: str, mtu: int, alias: str) -> None:
        links.ensure_vxlan(self._ipr, name, vni, local, mtu, alias)

    def ensure_vlan(self, name: str, parent: str, vlan_id: int, alias: str) -> None:
        links.ensure_vlan(self._ipr, name, parent, vlan_id, alias)

    def ensure_master(self, name: str, master: str) -> None:
        links.ensure_master(self._ipr, name, master)

    def set_remote_port(self, name: str) -> None:
        links.set_remote_port(self._ipr, name)

    def remote_macs(self, name: str, bridge: str) -> dict[str, RemoteMac]:
        return links.remote_macs(self._ipr, name, bridge)

    def set_remote_mac(self, name: str, bridge: str, remote: RemoteMac) -> None:
        links.set_remote_mac(self._ipr, name, bridge, remote)

    def drop_remote_mac(self, name: str, bridge: str, remote: RemoteMac) -> None:
        links.drop_remote_mac(self._ipr, name, bridge, remote)

    def sync_flood(self, name: str, peers: set[str]) -> tuple[set[str], set[str]]:
        return links.sync_flood(self._ipr, name, peers)

    def add_flood(self, name: str, peer: str) -> None:
        links.add_flood(self._ipr, name, peer)

    def drop_flood(self, name: str, peer: str) -> None:
        links.drop_flood(self._ipr, name, peer)

    def add_vlan(
        self, name: str, uplink: str, vlan_id: int, mac: str, mtu: int, netns_fd: int
    ) -> None:
        """Nested mode: a VLAN sub-interface of ``uplink`` born in the namespace ``netns_fd``."""
        links.add_vlan(self._ipr, name, uplink, vlan_id, mac, mtu, netns_fd)

    def addresses(self, name: str) -> tuple[LinkInfo, set[str]] | None:
        """The link and its addresses (``ip/prefix``), or None when there is no such link."""
        return links.pod_addresses(self._ipr, name)

    def open_tap(self, name: str, mtu: int, bridge: str, alias: str) -> int:
        """A tap in this namespace, marked, up in ``bridge``; the descriptor keeps it alive."""
        return tap.open_tap(self._ipr, name, mtu, bridge, alias)
