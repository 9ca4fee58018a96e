"""The only place podwire talks to the kernel's networking (pyroute2), docs/architecture.md §4.

``links`` holds plain functions on an open ``IPRoute``; ``nsexec`` runs them on worker threads
that sit in the right network namespace, so the event loop never blocks on netlink and never
switches namespaces.
"""

from podwire.netlink.errors import NetlinkFailure, NotANamespace
from podwire.netlink.nsexec import (
    HostNetlink,
    PodNetlink,
    host_netns_files,
    is_netns,
    netns_path,
    same_netns,
)

__all__ = [
    "HostNetlink",
    "NetlinkFailure",
    "NotANamespace",
    "PodNetlink",
    "host_netns_files",
    "is_netns",
    "netns_path",
    "same_netns",
]
