"""Taps: the host end of a port whose frames come from a user-space data path (memif).

A tap made here lives as long as some process holds its descriptor (it is not persistent):
the agent opens it in the host namespace, hands the descriptor to the data-path process and
closes its own copy, so the tap disappears with that process and a crash leaves no link.
"""

from __future__ import annotations

import fcntl
import os
import struct
from typing import Any

from podwire.netlink import links

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


def open_tap(ipr: Any, name: str, mtu: int, bridge: str, alias: str) -> int:
    """Create tap ``name`` in this thread's namespace, marked with ``alias``, up and enslaved
    to ``bridge``; the descriptor that keeps it alive is returned (``Netlink.open_tap``)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
        ipr.link("set", ifname=name, mtu=mtu, ifalias=alias)
        links.ensure_master(ipr, name, bridge)
    except BaseException:
        os.close(fd)
        raise
    return fd


def tun_available() -> bool:
    """Whether this machine can make taps at all (the memif capability depends on it)."""
    return os.access("/dev/net/tun", os.R_OK | os.W_OK)
