"""Link events of one network namespace, read on the event loop without a thread.

A netlink socket belongs to the namespace it was opened in, whatever thread reads it later:
so the socket is opened on a host netlink worker (which sits in the host's namespace) and then
read here with ``loop.add_reader``. It joins the link multicast group first and asks for a
dump second, so no link can appear between the two unseen; the dump's entries and the events
are the same RTM_NEWLINK messages and are handled alike. A receive queue that overflowed
(ENOBUFS) lost events: the stream then says so (``LinkResync``) and dumps again, so its reader
re-learns every link instead of trusting what it had.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from podwire.netlink.handle import Netlink
from podwire.netlink.model import LinkInfo
from podwire.netlink.rtnl import (
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    RTM_DELLINK,
    RTM_GETLINK,
    RTM_NEWLINK,
    RTMGRP_LINK,
    message,
    messages,
    parse_link,
)

RECEIVE_BUFFER = 4 << 20
_IFINFO_ANY = bytes(16)  # ifinfomsg for "every link"


@dataclass(frozen=True)
class LinkGone:
    index: int
    name: str


@dataclass(frozen=True)
class LinkResync:
    """Events were lost: a new dump follows, and its ``DumpDone`` ends it."""


@dataclass(frozen=True)
class DumpDone:
    """Every link there was has been listed since the start or the last ``LinkResync``."""


LinkEvent = LinkInfo | LinkGone | LinkResync | DumpDone


def open_link_events(nl: Netlink) -> socket.socket:
    """A non-blocking socket subscribed to link events of the worker's namespace (a host
    netlink job: ``HostNetlink.run(open_link_events)``)."""
    del nl  # only the thread's namespace matters
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind((0, RTMGRP_LINK))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _request_dump(sock: socket.socket) -> None:
    sock.send(message(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1, _IFINFO_ANY))


def _events(data: bytes) -> list[LinkEvent]:
    found: list[LinkEvent] = []
    for kind, _, _, payload in messages(data):
        if kind == RTM_NEWLINK:
            found.append(parse_link(payload))
        elif kind == RTM_DELLINK:
            gone = parse_link(payload)
            found.append(LinkGone(gone.index, gone.name))
        elif kind == NLMSG_DONE:
            found.append(DumpDone())
    return found


async def link_events(sock: socket.socket) -> AsyncGenerator[LinkEvent, None]:
    """Every link now (a dump), then every change, until the caller stops; closes ``sock``."""
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(sock.fileno(), readable.set)
    try:
        _request_dump(sock)
        while True:
            await readable.wait()
            readable.clear()
            while True:
                try:
                    data = sock.recv(1 << 16)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno != errno.ENOBUFS:
                        raise
                    yield LinkResync()
                    _request_dump(sock)
                    continue
                for event in _events(data):
                    yield event
    finally:
        loop.remove_reader(sock.fileno())
        sock.close()
