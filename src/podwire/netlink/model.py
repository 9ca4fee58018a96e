"""What the netlink layer reports about links, whichever library read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkInfo:
    """One link as the kernel describes it (a lookup's answer, a dump's entry or an event)."""

    index: int
    name: str
    kind: str
    master: int
    mtu: int
    mac: str
    up: bool
    alias: str = ""  # IFLA_IFALIAS: where podwire's agent marks the links it created
    vni: int | None = None
    vxlan_local: str | None = None
    vxlan_learning: bool | None = None  # learns remote MACs from frames (podwire: off)
    vxlan_proxy: bool | None = None  # answers ARP/ND itself, dropping unknown (podwire: off)


@dataclass(frozen=True)
class RemoteMac:
    """A MAC reached through a VXLAN device: the VTEP it is at and the IPs it answers for."""

    mac: str
    vtep: str
    ips: frozenset[str]
