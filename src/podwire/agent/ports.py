"""The one port-filter seam: every kind of port the agent wires is filtered through it alike.

A pod veth's host end (``pwp…``) and a memif port's tap (``pwt…``) are both marked host
interfaces on the network's bridge; the filter (the security-group enforcer) is told of each
port before its host interface exists, keyed on that interface's name, so no frame passes
unfiltered, and forgets it when the port is gone. ``None`` where a filter is taken means
enforcement is off on this node.
"""

from __future__ import annotations

from typing import Protocol

from podwire.schema.ports import DesiredPort


class PortFilter(Protocol):
    async def enforce(self, port: DesiredPort, ifname: str, within: float) -> None:
        """Return once ``port``'s rules are in force for the host interface ``ifname``."""

    def forget(self, port_id: str) -> None:
        """The port is gone from this node: its rules go with the next application."""
