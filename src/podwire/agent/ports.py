"""Every kind of port the agent wires ends as a marked host interface on the network's bridge:
a pod veth's host end (``pwp…``) or a memif port's tap (``pwt…``). Whoever must follow every
port alike (port filtering: security groups, anti-spoofing) registers here once and hears of
each port when its host interface exists and before traffic can flow, and when it is gone.

A new port kind registers nothing: it calls ``plugged``/``unplugged`` where it wires its host
interface, as the veth path (``cni_handler``) and the memif path (``memif``) do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from podwire.errors import PodwireError
from podwire.log import get_logger

log = get_logger(__name__)

VETH = "veth"
MEMIF = "memif"


@dataclass(frozen=True)
class HostPort:
    port_id: str
    kind: str  # VETH or MEMIF
    host_ifname: str
    mac: str  # the port's (the pod's or CNF's) MAC, not the host end's
    addresses: tuple[str, ...]  # "a.b.c.d/len"


PortListener = Callable[[HostPort], Awaitable[None]]


class HostPorts:
    def __init__(self) -> None:
        self._plugged: list[PortListener] = []
        self._unplugged: list[PortListener] = []

    def on_plugged(self, listener: PortListener) -> None:
        self._plugged.append(listener)

    def on_unplugged(self, listener: PortListener) -> None:
        self._unplugged.append(listener)

    async def plugged(self, port: HostPort) -> None:
        """Listeners' errors fail the caller (an ADD must not answer with an unfiltered port)."""
        for listener in self._plugged:
            await listener(port)

    async def unplugged(self, port: HostPort) -> None:
        """Best effort: a listener's failure is logged and the others still hear of it."""
        for listener in self._unplugged:
            try:
                await listener(port)
            except PodwireError as exc:
                log.warning("agent.port.unplug_listener_failed", port=port.port_id, error=str(exc))
