"""A lean rtnetlink socket for the CNI hot path: veth, addresses, default routes, delete.

pyroute2 builds and parses every message through layers of Python objects and runs its own
event loop per socket; for the handful of fixed messages an ADD or DEL sends, that was most of
the agent's CPU time per pod and, under a burst of 30 pods on two cores, most of the burst's
latency. These messages are packed with ``struct`` and sent on a plain netlink socket; the kernel
does the same work either way. The binder's plumbing (bridges, VXLAN, FDB) stays on pyroute2
(``links``): it is not latency critical and needs the attribute building and parsing of many
more message kinds. ``handle.Netlink`` is the one API over both.

Errors are ``RtnlError`` (an ``OSError`` with the kernel's errno and, when the kernel supplies
one, its extended-ack message), which ``netlink.errors.translate`` turns into podwire errors.
The socket, message and ack helpers (``open_socket``, ``message``, ``messages``, ``error_of``)
are netlink's, not rtnetlink's: ``netfilter/nfnl.py`` sends its nf_tables batches with them.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from podwire.netlink.model import LinkInfo

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
NLM_F_DUMP = 0x300
RTMGRP_LINK = 0x1
NLM_F_ACK_TLVS = 0x200  # on an error message: extended-ack attributes follow
SOL_NETLINK, NETLINK_CAP_ACK, NETLINK_EXT_ACK = 270, 10, 11
NLMSGERR_ATTR_MSG = 1
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_NEWADDR, RTM_NEWROUTE = 16, 17, 18, 20, 24
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_MASTER = 1, 3, 4, 10
IFLA_LINKINFO, IFLA_IFALIAS, IFLA_NET_NS_FD = 18, 20, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFLA_VXLAN_ID, IFLA_VXLAN_LOCAL, IFLA_VXLAN_LEARNING, IFLA_VXLAN_PROXY = 1, 4, 7, 11
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5
IFF_UP = 0x1
RT_TABLE_MAIN, RTPROT_BOOT, RTN_UNICAST = 254, 3, 1

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg
_ATTR = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_ERRNO = struct.Struct("=i")


class RtnlError(OSError):
    """The kernel refused a request; ``errno`` is its code."""

    @property
    def code(self) -> int:
        return int(self.errno or 0)


def attr(kind: int, data: bytes) -> bytes:
    length = _ATTR.size + len(data)
    return _ATTR.pack(length, kind) + data + b"\0" * (-length % 4)


def _name(name: str) -> bytes:
    return name.encode() + b"\0"


def _mac(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def _ifinfo(index: int = 0, up: bool = False) -> bytes:
    flags = IFF_UP if up else 0
    return _IFINFO.pack(socket.AF_UNSPEC, 0, index, flags, flags)


@dataclass(frozen=True)
class VethSpec:
    host_name: str
    host_mac: str
    peer_name: str
    peer_mac: str
    peer_netns_fd: int
    mtu: int
    master_index: int
    host_up: bool = True  # false: born down, brought up later (its filter is still coming)


def veth_message(spec: VethSpec) -> bytes:
    """The host end up (or held down) and in its bridge at birth, the peer born in the pod
    namespace: one request instead of three."""
    peer = _ifinfo() + b"".join(
        (
            attr(IFLA_IFNAME, _name(spec.peer_name)),
            attr(IFLA_ADDRESS, _mac(spec.peer_mac)),
            attr(IFLA_MTU, _U32.pack(spec.mtu)),
            attr(IFLA_NET_NS_FD, _U32.pack(spec.peer_netns_fd)),
        )
    )
    linkinfo = attr(IFLA_INFO_KIND, b"veth") + attr(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer))
    return _ifinfo(up=spec.host_up) + b"".join(
        (
            attr(IFLA_IFNAME, _name(spec.host_name)),
            attr(IFLA_ADDRESS, _mac(spec.host_mac)),
            attr(IFLA_MTU, _U32.pack(spec.mtu)),
            attr(IFLA_MASTER, _U32.pack(spec.master_index)),
            attr(IFLA_LINKINFO, linkinfo),
        )
    )


def address_message(index: int, address: str) -> bytes:
    iface = ipaddress.ip_interface(address)
    family = socket.AF_INET6 if iface.version == 6 else socket.AF_INET
    packed = iface.ip.packed
    body = _IFADDR.pack(family, iface.network.prefixlen, 0, 0, index)
    return body + attr(IFA_LOCAL, packed) + attr(IFA_ADDRESS, packed)


def route_message(index: int, gateway: str, destination: str | None = None) -> bytes:
    """A unicast route via ``gateway`` out of link ``index``; no destination: the default."""
    via = ipaddress.ip_address(gateway)
    family = socket.AF_INET6 if via.version == 6 else socket.AF_INET
    dst = None if destination is None else ipaddress.ip_network(destination)
    length = 0 if dst is None else dst.prefixlen
    body = _RTMSG.pack(family, length, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, 0, RTN_UNICAST, 0)
    if dst is not None and length:
        body += attr(RTA_DST, dst.network_address.packed)
    return body + attr(RTA_GATEWAY, via.packed) + attr(RTA_OIF, _U32.pack(index))


def parse_attrs(payload: bytes, offset: int) -> dict[int, bytes]:
    """Netlink attributes from ``offset`` on, by type (nested/byte-order flags masked off)."""
    found: dict[int, bytes] = {}
    while offset + _ATTR.size <= len(payload):
        length, kind = _ATTR.unpack_from(payload, offset)
        if length < _ATTR.size:
            break
        found.setdefault(kind & 0x3FFF, payload[offset + _ATTR.size : offset + length])
        offset += (length + 3) & ~3
    return found


def _ack_message(payload: bytes, flags: int) -> str:
    """The kernel's extended-ack text, if it sent one (after the 4-byte error code and the
    echoed request header, since we asked for capped acks)."""
    if not flags & NLM_F_ACK_TLVS:
        return ""
    text = parse_attrs(payload, _ERRNO.size + _HEADER.size).get(NLMSGERR_ATTR_MSG, b"")
    return text.rstrip(b"\0").decode(errors="replace")


def open_socket(protocol: int) -> socket.socket:
    """A netlink socket of ``protocol`` in the calling thread's namespace, with capped and
    extended acks (errors come back with the kernel's explanation)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
    try:
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        sock.bind((0, 0))
    except OSError:
        sock.close()
        raise
    return sock


def message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    return _HEADER.pack(_HEADER.size + len(body), kind, flags, seq, 0) + body


def messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, payload) of each message in one datagram."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, flags, seq, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            return
        yield kind, flags, seq, data[offset + _HEADER.size : offset + length]
        offset += (length + 3) & ~3


def error_of(payload: bytes, flags: int, what: str) -> RtnlError | None:
    """The error an NLMSG_ERROR message carries; None for an acknowledgement."""
    (code,) = _ERRNO.unpack_from(payload)
    if not code:
        return None
    detail = _ack_message(payload, flags)
    return RtnlError(-code, f"{what}: {os.strerror(-code)}" + (f": {detail}" if detail else ""))


def parse_link(payload: bytes) -> LinkInfo:
    _, _, index, flags, _ = _IFINFO.unpack_from(payload)
    attrs = parse_attrs(payload, _IFINFO.size)
    linkinfo = parse_attrs(attrs.get(IFLA_LINKINFO, b""), 0)
    kind = _text(linkinfo.get(IFLA_INFO_KIND, b""))
    vxlan = parse_attrs(linkinfo.get(IFLA_INFO_DATA, b""), 0) if kind == "vxlan" else None
    return LinkInfo(
        index=index,
        name=_text(attrs.get(IFLA_IFNAME, b"")),
        kind=kind,
        master=_u32(attrs.get(IFLA_MASTER)),
        mtu=_u32(attrs.get(IFLA_MTU)),
        mac=":".join(f"{b:02x}" for b in attrs.get(IFLA_ADDRESS, b"")),
        up=bool(flags & IFF_UP),
        alias=_text(attrs.get(IFLA_IFALIAS, b"")),
        **({} if vxlan is None else _vxlan(vxlan)),
    )


def _vxlan(data: dict[int, bytes]) -> dict[str, Any]:
    local = data.get(IFLA_VXLAN_LOCAL)
    return {
        "vni": _u32(data.get(IFLA_VXLAN_ID)),
        "vxlan_local": str(ipaddress.IPv4Address(local)) if local and len(local) == 4 else None,
        "vxlan_learning": bool(data.get(IFLA_VXLAN_LEARNING, b"\0")[0]),
        "vxlan_proxy": bool(data.get(IFLA_VXLAN_PROXY, b"\0")[0]),
    }


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode(errors="replace")


def _u32(raw: bytes | None) -> int:
    return _U32.unpack_from(raw)[0] if raw and len(raw) >= _U32.size else 0


class Rtnl:
    """One NETLINK_ROUTE socket, bound to the namespace of the thread that opened it.

    Requests are synchronous and not thread-safe: each worker thread owns its sockets.
    """

    def __init__(self) -> None:
        self._sock = open_socket(socket.NETLINK_ROUTE)
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def _send(self, kind: int, flags: int, body: bytes) -> int:
        self._seq += 1
        self._sock.send(message(kind, NLM_F_REQUEST | flags, self._seq, body))
        return self._seq

    def _reply(self, seq: int, what: str) -> tuple[int, bytes]:
        """The answer to ``seq`` (type, payload); an error answer raises RtnlError."""
        while True:
            for kind, flags, got_seq, payload in messages(self._sock.recv(65536)):
                if got_seq != seq:
                    continue  # an answer to an earlier, abandoned request
                if kind == NLMSG_ERROR:
                    error = error_of(payload, flags, what)
                    if error is not None:
                        raise error
                return kind, payload

    def request(self, kind: int, body: bytes, what: str, create: bool = False) -> None:
        """Send and wait for the kernel's acknowledgement."""
        flags = NLM_F_ACK | (NLM_F_CREATE | NLM_F_EXCL if create else 0)
        self._reply(self._send(kind, flags, body), what)

    def _get_link(self, name: str) -> bytes | None:
        """The kernel's ifinfo message for the link, or None when there is none."""
        seq = self._send(RTM_GETLINK, 0, _ifinfo() + attr(IFLA_IFNAME, _name(name)))
        try:
            _, payload = self._reply(seq, f"get link {name}")
        except RtnlError as exc:
            if exc.code == errno.ENODEV:
                return None
            raise
        return payload

    def link_index(self, name: str) -> int | None:
        payload = self._get_link(name)
        return None if payload is None else int(_IFINFO.unpack_from(payload)[2])

    def set_alias(self, name: str, alias: str) -> None:
        body = _ifinfo() + attr(IFLA_IFNAME, _name(name)) + attr(IFLA_IFALIAS, _name(alias))
        self.request(RTM_NEWLINK, body, f"set alias of {name}")

    def require_index(self, name: str) -> int:
        index = self.link_index(name)
        if index is None:
            raise RtnlError(errno.ENODEV, f"{name}: no such device")
        return index

    def add_veth(self, spec: VethSpec) -> None:
        self.request(RTM_NEWLINK, veth_message(spec), f"add veth {spec.host_name}", create=True)

    def set_up(self, index: int) -> None:
        self.request(RTM_NEWLINK, _ifinfo(index, up=True), f"set link {index} up")

    def set_link(self, index: int, mtu: int | None = None, master: int | None = None) -> None:
        """MTU and bridge (``master`` 0: out of any bridge) of link ``index``, in one request."""
        body = _ifinfo(index)
        if mtu is not None:
            body += attr(IFLA_MTU, _U32.pack(mtu))
        if master is not None:
            body += attr(IFLA_MASTER, _U32.pack(master))
        self.request(RTM_NEWLINK, body, f"set link {index}")

    def link(self, name: str) -> LinkInfo | None:
        payload = self._get_link(name)
        return None if payload is None else parse_link(payload)

    def links(self) -> list[LinkInfo]:
        """Every link of the namespace (one dump)."""
        seq = self._send(RTM_GETLINK, NLM_F_DUMP, _ifinfo())
        found: list[LinkInfo] = []
        while True:
            for kind, flags, got_seq, payload in messages(self._sock.recv(1 << 16)):
                if got_seq != seq:
                    continue
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    error = error_of(payload, flags, "dump links")
                    if error is not None:
                        raise error
                elif kind == RTM_NEWLINK:
                    found.append(parse_link(payload))

    def delete_link(self, name: str) -> bool:
        """False when there was nothing to delete."""
        try:
            self.request(RTM_DELLINK, _ifinfo() + attr(IFLA_IFNAME, _name(name)), f"del {name}")
        except RtnlError as exc:
            if exc.code == errno.ENODEV:
                return False
            raise
        return True

    def add_address(self, index: int, address: str) -> None:
        """Idempotent: an address already there is success."""
        self._create_ignoring_exists(RTM_NEWADDR, address_message(index, address), address)

    def add_route(self, index: int, gateway: str, destination: str | None = None) -> None:
        """Idempotent, like ``add_address``; no destination: the default route."""
        message = route_message(index, gateway, destination)
        self._create_ignoring_exists(
            RTM_NEWROUTE, message, f"route {destination or 'default'} via {gateway}"
        )

    def _create_ignoring_exists(self, kind: int, body: bytes, what: str) -> None:
        try:
            self.request(kind, body, f"add {what}", create=True)
        except RtnlError as exc:
            if exc.code != errno.EEXIST:
                raise
