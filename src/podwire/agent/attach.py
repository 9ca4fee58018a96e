"""Plugging a pod in and out: the veth (or, nested, a VLAN sub-interface) and its addresses.

Host-side steps run on the host netlink workers, pod-side steps on a thread that enters the
pod's namespace. ``plug`` removes what it created if a later step fails, so a failed ADD leaves
nothing behind.
"""

from __future__ import annotations

import errno
import hashlib
import os
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from podwire.agent import naming
from podwire.cni.result import Address, Attached
from podwire.errors import PodwireError
from podwire.netlink import HostNetlink, PodNetlink, is_netns, links
from podwire.netlink.links import PodAddress
from podwire.netlink.nsexec import open_netns


@dataclass(frozen=True)
class PlugSpec:
    attachment: str
    netns: str
    ifname: str
    mac: str
    mtu: int
    bridge: str
    addresses: tuple[Address, ...]


def _add_veth(ipr: Any, spec: PlugSpec, host_name: str, host_mac: str) -> None:
    fd = open_netns(spec.netns)
    try:
        try:
            links.add_veth(
                ipr, host_name, host_mac, spec.ifname, fd, spec.mac, spec.mtu, spec.bridge
            )
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise
            # A leftover of a crashed ADD (same derived name): replace it.
            links.remove_link(ipr, host_name)
            links.add_veth(
                ipr, host_name, host_mac, spec.ifname, fd, spec.mac, spec.mtu, spec.bridge
            )
    finally:
        os.close(fd)


def host_mac(attachment: str) -> str:
    """A stable, locally administered unicast MAC for the host end (no read-back needed)."""
    digest = hashlib.sha256(b"podwire-host:" + attachment.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def _add_vlan(ipr: Any, spec: PlugSpec, uplink: str, vlan_id: int) -> None:
    fd = open_netns(spec.netns)
    try:
        links.add_vlan(ipr, spec.ifname, uplink, vlan_id, spec.mac, spec.mtu, fd)
    finally:
        os.close(fd)


def _configure(ipr: Any, ifname: str, addresses: list[PodAddress]) -> None:
    links.configure_pod_interface(ipr, ifname, addresses)


def is_nested(attached: Attached) -> bool:
    return not attached.host_mac


class Plugger:
    def __init__(self, host_nl: HostNetlink, pod_nl: PodNetlink) -> None:
        self._host = host_nl
        self._pod = pod_nl

    async def plug(self, spec: PlugSpec) -> Attached:
        host_name = naming.host_veth(spec.attachment)
        mac = host_mac(spec.attachment)
        await self._host.run(_add_veth, spec, host_name, mac)
        try:
            pod_addresses = [PodAddress(a.address, a.gateway) for a in spec.addresses]
            await self._pod.run(spec.netns, _configure, spec.ifname, pod_addresses)
        except PodwireError:
            await self._host.run(links.remove_link, host_name)
            raise
        return Attached(
            host_ifname=host_name,
            host_mac=mac,
            ifname=spec.ifname,
            mac=spec.mac,
            mtu=spec.mtu,
            sandbox=spec.netns,
            addresses=spec.addresses,
        )

    async def plug_nested(self, spec: PlugSpec, uplink: str, vlan_id: int) -> Attached:
        """Nested mode (the node is a VM on a trunk): the pod interface is a VLAN
        sub-interface of the uplink, with the subport's VLAN id and MAC, born in the pod."""
        await self._host.run(_add_vlan, spec, uplink, vlan_id)
        try:
            pod_addresses = [PodAddress(a.address, a.gateway) for a in spec.addresses]
            await self._pod.run(spec.netns, _configure, spec.ifname, pod_addresses)
        except PodwireError:
            await self._pod.run(spec.netns, links.remove_link, spec.ifname)
            raise
        return Attached(
            host_ifname=uplink,
            host_mac="",
            ifname=spec.ifname,
            mac=spec.mac,
            mtu=spec.mtu,
            sandbox=spec.netns,
            addresses=spec.addresses,
        )

    async def unplug(self, attachment: str, attached: Attached | None = None) -> bool:
        """Remove the veth by its host end (works when the pod namespace is gone already);
        a nested VLAN interface lives only in the pod, and goes with its namespace."""
        if attached is not None and is_nested(attached):
            if not is_netns(attached.sandbox):
                return False
            return await self._pod.run(attached.sandbox, links.remove_link, attached.ifname)
        return await self._host.run(links.remove_link, naming.host_veth(attachment))

    async def check(self, attached: Attached, bridge: str) -> str | None:
        """None when the attachment is as ADD left it, else what is wrong."""
        if not is_nested(attached):
            problem = await self._check_host(attached, bridge)
            if problem is not None:
                return problem
        if not is_netns(attached.sandbox):
            return f"network namespace {attached.sandbox} is gone"
        found = await self._pod.run(attached.sandbox, links.pod_addresses, attached.ifname)
        if found is None:
            return f"interface {attached.ifname} is missing in {attached.sandbox}"
        link, addresses = found
        if link.mac != attached.mac:
            return f"interface {attached.ifname} has MAC {link.mac}, expected {attached.mac}"
        missing = {a.address for a in attached.addresses} - addresses
        if missing:
            return f"interface {attached.ifname} lacks addresses {sorted(missing)}"
        return None

    async def _check_host(self, attached: Attached, bridge: str) -> str | None:
        host = await self._host.run(links.get_link, attached.host_ifname)
        if host is None:
            return f"host interface {attached.host_ifname} is missing"
        master = await self._host.run(links.get_link, bridge)
        if master is None or host.master != master.index:
            return f"host interface {attached.host_ifname} is not attached to bridge {bridge}"
        return None
