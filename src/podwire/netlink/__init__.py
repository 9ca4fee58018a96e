"""The only place podwire talks to the kernel's networking, docs/architecture.md §4.

Jobs get a ``Netlink`` handle (``handle``) from the workers that sit in the right namespace
(``nsexec``), so the event loop never blocks on netlink and never switches namespaces. Which
library serves a call (the lean packer in ``rtnl`` on the hot path, pyroute2 in ``links``
for the plumbing) is the handle's business. Everything outside this package imports from
here, never from its modules (an import contract checks the agent).
"""

from podwire.netlink.errors import NetlinkFailure, NotANamespace
from podwire.netlink.gratuitous import announce
from podwire.netlink.handle import Netlink
from podwire.netlink.model import LinkInfo, RemoteMac
from podwire.netlink.monitor import (
    DumpDone,
    LinkEvent,
    LinkGone,
    LinkResync,
    link_events,
    open_link_events,
)
from podwire.netlink.netns import (
    NETNS_DIR,
    host_netns_files,
    is_netns,
    netns_path,
    open_netns,
    same_netns,
    setns,
)
from podwire.netlink.nsexec import HostNetlink, PodNetlink
from podwire.netlink.rtnl import RtnlError, VethSpec
from podwire.netlink.tap import tun_available

__all__ = [
    "NETNS_DIR",
    "DumpDone",
    "HostNetlink",
    "LinkEvent",
    "LinkGone",
    "LinkInfo",
    "LinkResync",
    "Netlink",
    "NetlinkFailure",
    "NotANamespace",
    "PodNetlink",
    "RemoteMac",
    "RtnlError",
    "VethSpec",
    "announce",
    "host_netns_files",
    "is_netns",
    "link_events",
    "netns_path",
    "open_link_events",
    "open_netns",
    "same_netns",
    "setns",
    "tun_available",
]
