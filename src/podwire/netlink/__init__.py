"""The only place podwire talks to the kernel's networking (pyroute2), docs/architecture.md §4.

``links`` holds plain functions on an open ``IPRoute``; ``nsexec`` runs them on worker threads
that sit in the right network namespace, so the event loop never blocks on netlink and never
switches namespaces.
"""

from podwire.netlink.errors import NetlinkFailure, NotANamespace
from podwire.netlink.nsexec import HostNetlink, PodNetlink, is_netns, netns_path

__all__ = ["HostNetlink", "NetlinkFailure", "NotANamespace", "PodNetlink", "is_netns", "netns_path"]
