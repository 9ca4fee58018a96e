"""One way to attach a port on this node, whatever makes its host interface.

Every port ends as a host interface on its network's bridge: a pod's veth (``veth.py``), the
tap a memif master feeds (``memif.py``), or a device someone else made and the agent adopts
(a VM's or a Neutron agent's, ``taps.py``). The steps they share live here, once:

1. ``wiring``: the port is wired on this host — with exactly the VIF's security groups when
   the VIF came from a request (a pooled port the controller moved to other groups is
   enforced with the new ones, never the old) — and from that come the network's bridge, the
   lower of the two MTUs, and the interface addresses.
2. ``attach``: the port's rules are put in force for the host interface's name while the
   kind's plug runs; the plug lets frames pass only once they are (its ``gate``), so no frame
   is ever unfiltered; a failure of either forgets the rules and is raised, with the plug's
   own clean-up done.

What differs per kind is only its plug (a coroutine function of the gate). What a caller
keeps (the checkpoint, the VIF to release) stays the caller's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from podwire.agent import naming
from podwire.agent.fabric.binder import Binder
from podwire.schema.checkpoints import Address
from podwire.schema.ports import DesiredPort, FixedIp
from podwire.schema.vif import Vif

T = TypeVar("T")
Gate = asyncio.Future[None]


@dataclass(frozen=True)
class Wiring:
    """What a port's host interface needs, resolved from its wired desired value."""

    port: DesiredPort
    bridge: str
    mtu: int
    addresses: tuple[Address, ...]


class PortFilter(Protocol):
    """The one port-filter seam (the security-group enforcer), taken only here, so every kind
    of port is filtered alike: told of each port before its host interface exists, keyed on
    that interface's name, so no frame passes unfiltered, and told when the port is gone.
    ``None`` where a filter is taken means enforcement is off on this node."""

    async def enforce(self, port: DesiredPort, ifname: str, within: float) -> None:
        """Return once ``port``'s rules are in force for the host interface ``ifname``."""

    def forget(self, port_id: str) -> None:
        """The port is gone from this node: its rules go with the next application."""


# One kind of host interface: it must not let a frame through before the gate is done (None:
# enforcement is off), and removes what it made if it fails.
Plug = Callable[[Gate | None], Awaitable[T]]


def addresses_of(fixed_ips: Iterable[FixedIp]) -> tuple[Address, ...]:
    return tuple(Address(ip.interface, ip.gateway_ip, ip.host_routes) for ip in fixed_ips)


async def gate_open(gate: Gate | None) -> None:
    """For plugs that make their interface only once the rules are in force."""
    if gate is not None:
        await gate


class Attacher:
    def __init__(self, binder: Binder, port_filter: PortFilter | None) -> None:
        self._binder = binder
        self.filter = port_filter

    async def wiring(self, vif: Vif, deadline: float) -> Wiring:
        groups = vif.security_groups if self.filter is not None else None
        port = await self._binder.wait_wired(vif.port_id, _left(deadline), groups)
        return self.wiring_of(port, vif.mtu)

    def wiring_of(self, port: DesiredPort, mtu: int | None = None) -> Wiring:
        plan = self._binder.plan_for(port.network_id)
        bridge = plan.bridge if plan is not None else naming.bridge(port.network_id)
        mtu = port.mtu if mtu is None else min(port.mtu, mtu)
        return Wiring(port, bridge, mtu, addresses_of(port.fixed_ips))

    async def attach(self, port: DesiredPort, ifname: str, plug: Plug[T], deadline: float) -> T:
        """``plug`` with the port's rules in force for ``ifname`` before a frame passes."""
        enforced = self._enforce(port, ifname, deadline)
        try:
            return await plug(enforced)
        except BaseException:
            self.forget(port.port_id)
            raise
        finally:
            if enforced is not None:
                enforced.cancel()  # a no-op once done; a plug that failed first stops it

    def current(self, port_id: str) -> DesiredPort | None:
        """The port's desired value as wired here now (None: not wired)."""
        return self._binder.wired.get(port_id)

    async def enforce(self, port: DesiredPort, ifname: str, within: float) -> None:
        """Until ``port``'s current rules are in force for ``ifname`` (nothing when
        enforcement is off)."""
        if self.filter is not None:
            await self.filter.enforce(port, ifname, within)

    def forget(self, port_id: str) -> None:
        """The port's host interface is gone for good: its rules go with the next change."""
        if self.filter is not None:
            self.filter.forget(port_id)

    def _enforce(self, port: DesiredPort, ifname: str, deadline: float) -> Gate | None:
        if self.filter is None:
            return None
        enforced = asyncio.ensure_future(self.filter.enforce(port, ifname, _left(deadline)))
        # A failure after the plug already failed is not the caller's error: retrieved here.
        enforced.add_done_callback(lambda done: done.cancelled() or done.exception())
        return enforced


def _left(deadline: float) -> float:
    return max(0.0, deadline - asyncio.get_running_loop().time())
