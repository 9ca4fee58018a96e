"""Plugging a pod in and out: the veth (or, nested, a VLAN sub-interface) and its addresses.

Plugging runs as one job on a host netlink worker (the pod side through a handle whose sockets
are opened inside the pod's namespace).
``plug`` removes what it created if a later step fails, so a failed ADD leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from dataclasses import dataclass

from podwire.agent import naming
from podwire.errors import PermanentError, PodwireError
from podwire.log import get_logger
from podwire.netlink import (
    HostNetlink,
    Netlink,
    PodNetlink,
    RtnlError,
    VethSpec,
    is_netns,
    open_netns,
)
from podwire.schema.checkpoints import Address, Attached

log = get_logger(__name__)


@dataclass(frozen=True)
class PlugSpec:
    attachment: str
    netns: str
    ifname: str
    mac: str
    mtu: int
    bridge: str
    addresses: tuple[Address, ...]


def _plug_veth(
    nl: Netlink,
    spec: PlugSpec,
    host_name: str,
    host_mac: str,
    gate: threading.Event | None,
) -> bool:
    """The whole veth ADD in one worker job: create, then configure the pod end; a failure
    after the veth exists removes it (deleting the host end takes the pod end with it).
    With ``gate``, the host end is born down and comes up here only if the gate is open by
    now; returns whether the host end is up."""
    fd = open_netns(spec.netns)
    try:
        veth = VethSpec(
            host_name,
            host_mac,
            spec.ifname,
            spec.mac,
            fd,
            spec.mtu,
            nl.require_index(spec.bridge),
            gate is None,
        )
        try:
            nl.add_veth(veth)
        except RtnlError as exc:
            if exc.code != errno.EEXIST:
                raise
            _replace_leftover(nl, spec, host_name, host_mac)
            nl.add_veth(veth)
        try:
            nl.set_alias(host_name, naming.MARK)
            _configure_in(nl, fd, spec)
            if gate is not None and gate.is_set():
                _host_end_up(nl, host_name)
                return True
        except BaseException:
            nl.remove_link(host_name)
            raise
    finally:
        os.close(fd)
    return gate is None


def _replace_leftover(nl: Netlink, spec: PlugSpec, host_name: str, host_mac: str) -> None:
    """One of the veth's names is taken: a leftover of a crashed ADD (the same derived host
    name, ours) is removed; anything else is a clash retrying cannot fix."""
    owned = _own_veth(nl, host_name, host_mac)
    if owned is None:  # no host end: the pod side's name is the one taken
        raise PodInterfaceTaken(
            f"CNI_IFNAME {spec.ifname}: an interface of that name already exists in"
            f" {spec.netns}; choose another name or remove it"
        )
    if owned is False:
        raise PermanentError(
            f"host interface {host_name} exists and is not podwire's (no mark {naming.MARK!r},"
            " not its derived MAC): it is left alone; remove it to attach this pod"
        )
    nl.remove_link(host_name)


class PodInterfaceTaken(PermanentError):
    """The pod's namespace already has an interface of the requested name."""


def _host_end_up(nl: Netlink, host_name: str) -> None:
    nl.set_up(nl.require_index(host_name))


def _open_if_done(gate: asyncio.Future[None], opened: threading.Event) -> None:
    """Opened only by a gate that succeeded."""
    if not gate.cancelled() and gate.exception() is None:
        opened.set()


def _configure_in(nl: Netlink, netns_fd: int, spec: PlugSpec) -> None:
    """Inside the pod: link up, addresses, a default route via each address's gateway, then
    the subnet's host routes (their next hops are on a subnet that is up by then)."""
    pod = nl.in_netns(netns_fd)
    try:
        index = pod.require_index(spec.ifname)
        pod.set_up(index)
        for item in spec.addresses:
            pod.add_address(index, item.address)
        for item in spec.addresses:
            if item.gateway is not None:
                pod.add_route(index, item.gateway)
            for route in item.routes:
                pod.add_route(index, route.nexthop, route.destination)
    finally:
        pod.close()


def _configure_pod(nl: Netlink, spec: PlugSpec) -> None:
    fd = open_netns(spec.netns)
    try:
        _configure_in(nl, fd, spec)
    finally:
        os.close(fd)


def _own_veth(nl: Netlink, name: str, mac: str) -> bool | None:
    """Whether the host veth ``name`` is podwire's: marked, or with the MAC podwire derives
    for it (veths of agents from before marks). None when there is no such link."""
    found = nl.link(name)
    if found is None:
        return None
    return naming.is_marked(found.alias) or found.mac == mac


def _delete_own_veth(nl: Netlink, name: str, mac: str) -> bool:
    """Remove the attachment's host veth if it is ours; a foreign link of that name stays."""
    owned = _own_veth(nl, name, mac)
    if owned is False:
        log.warning("agent.veth.foreign_left_alone", interface=name)
    return bool(owned) and nl.remove_link(name)


def _derived_ids(attachment: str) -> list[str]:
    """The ids a veth of this attachment may be named by: the current one, and the
    ``<container>.<ifname>`` form agents before the ':' separator derived names from (no
    record of it may be left after a crash)."""
    return [attachment, attachment.replace(":", ".", 1)] if ":" in attachment else [attachment]


def host_mac(attachment: str) -> str:
    """The host end's MAC."""
    return naming.stable_mac("host", attachment)


def _add_vlan(nl: Netlink, spec: PlugSpec, uplink: str, vlan_id: int) -> None:
    fd = open_netns(spec.netns)
    try:
        nl.add_vlan(spec.ifname, uplink, vlan_id, spec.mac, spec.mtu, fd)
    finally:
        os.close(fd)


def planned(spec: PlugSpec, uplink: str = "") -> Attached:
    """What ``plug`` (or, with the ``uplink``, ``plug_nested``) makes of ``spec``: known
    before it runs, so the checkpoint can record it meanwhile."""
    return Attached(
        host_ifname=uplink or naming.host_veth(spec.attachment),
        host_mac="" if uplink else host_mac(spec.attachment),
        ifname=spec.ifname,
        mac=spec.mac,
        mtu=spec.mtu,
        sandbox=spec.netns,
        addresses=spec.addresses,
    )


def is_nested(attached: Attached) -> bool:
    return not attached.host_mac


class Plugger:
    def __init__(self, host_nl: HostNetlink, pod_nl: PodNetlink) -> None:
        self._host = host_nl
        self._pod = pod_nl

    async def plug(self, spec: PlugSpec, gate: asyncio.Future[None] | None = None) -> Attached:
        """With ``gate`` (the port's rules being put in force), the host end is born down, so
        no frame crosses it, and comes up once ``gate`` is done: the two overlap instead of
        running one after the other, and when the rules were first (the usual case) the same
        netlink job brings the host end up. A failure of either removes the veth and is
        raised."""
        host_name = naming.host_veth(spec.attachment)
        mac = host_mac(spec.attachment)
        opened = None
        if gate is not None:
            opened = threading.Event()
            if gate.done():
                _open_if_done(gate, opened)
            else:
                gate.add_done_callback(lambda done: _open_if_done(done, opened))
        up = await self._host.run(_plug_veth, spec, host_name, mac, opened)
        if gate is not None:
            try:
                await gate
                if not up:
                    await self._host.run(_host_end_up, host_name)
            except BaseException:
                await self._host.run_teardown(_delete_own_veth, host_name, mac)
                raise
        return planned(spec)

    async def plug_nested(self, spec: PlugSpec, uplink: str, vlan_id: int) -> Attached:
        """Nested mode (the node is a VM on a trunk): the pod interface is a VLAN
        sub-interface of the uplink, with the subport's VLAN id and MAC, born in the pod."""
        await self._host.run(_add_vlan, spec, uplink, vlan_id)
        try:
            await self._host.run(_configure_pod, spec)
        except PodwireError:
            await self._pod.run(spec.netns, Netlink.remove_link, spec.ifname)
            raise
        return planned(spec, uplink)

    async def unplug(self, attachment: str, attached: Attached | None = None) -> bool:
        """Remove the veth by its host end (works when the pod namespace is gone already);
        a nested VLAN interface lives only in the pod, and goes with its namespace."""
        if attached is not None and is_nested(attached):
            if not is_netns(attached.sandbox):
                return False
            return await self._pod.run(attached.sandbox, Netlink.remove_link, attached.ifname)
        if attached is not None:  # the recorded name and MAC: right for any agent version
            return await self._host.run_teardown(
                _delete_own_veth, attached.host_ifname, attached.host_mac
            )
        removed = False
        for derived in _derived_ids(attachment):
            name, mac = naming.host_veth(derived), host_mac(derived)
            removed = await self._host.run_teardown(_delete_own_veth, name, mac) or removed
        return removed

    async def check(self, attached: Attached, bridge: str) -> str | None:
        """None when the attachment is as ADD left it, else what is wrong."""
        if not is_nested(attached):
            problem = await self._check_host(attached, bridge)
            if problem is not None:
                return problem
        if not is_netns(attached.sandbox):
            return f"network namespace {attached.sandbox} is gone"
        found = await self._pod.run(attached.sandbox, Netlink.addresses, attached.ifname)
        if found is None:
            return f"interface {attached.ifname} is missing in {attached.sandbox}"
        link, addresses = found
        if link.mac != attached.mac:
            return f"interface {attached.ifname} has MAC {link.mac}, expected {attached.mac}"
        missing = {a.address for a in attached.addresses} - addresses
        if missing:
            return f"interface {attached.ifname} lacks addresses {sorted(missing)}"
        return None

    async def host_ports(self) -> dict[str, int]:
        """Every host-side interface by name, with the index of its bridge (0: none), in one
        dump: the repair pass looks at all attachments at once."""
        return {link.name: link.master for link in await self._host.run(Netlink.links)}

    async def bridge_index(self, bridge: str) -> int | None:
        link = await self._host.run(Netlink.link, bridge)
        return None if link is None else link.index

    async def _check_host(self, attached: Attached, bridge: str) -> str | None:
        host = await self._host.run(Netlink.link, attached.host_ifname)
        if host is None:
            return f"host interface {attached.host_ifname} is missing"
        master = await self._host.run(Netlink.link, bridge)
        if master is None or host.master != master.index:
            return f"host interface {attached.host_ifname} is not attached to bridge {bridge}"
        return None
