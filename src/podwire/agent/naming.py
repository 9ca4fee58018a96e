"""Names of the interfaces the agent owns (at most 15 characters, IFNAMSIZ - 1).

Names are derived, never random, so a restarted agent finds its own interfaces again and two
agents never compete for one name. The ``pw`` prefix alone does not make a link podwire's:
anyone can name a bridge ``pwbr...``. The agent marks what it creates (or adopts for a port
it serves) with the alias ``MARK`` and deletes only links carrying it; a pod's host veth also
counts as ours when it has the MAC derived from its attachment (``veth.host_mac``), which
every version of the agent has set, so veths of an agent from before marks are still removed.
"""

from __future__ import annotations

import hashlib

from podwire.sgpolicy.compile import DevicePrefixes

MARK = "podwire:agent"
BRIDGE_PREFIX = "pwbr"
VXLAN_PREFIX = "pwvx"
VLAN_PREFIX = "pwvl"
# What the security-group ruleset tells the agent's bridges and VXLAN devices by.
DEVICES = DevicePrefixes(bridge=BRIDGE_PREFIX, vxlan=VXLAN_PREFIX)


def is_marked(alias: str) -> bool:
    return alias == MARK


def _short(value: str) -> str:
    return value.replace("-", "")[:11]


def bridge(network_id: str) -> str:
    return BRIDGE_PREFIX + _short(network_id)


def vxlan(network_id: str) -> str:
    return VXLAN_PREFIX + _short(network_id)


def vlan(network_id: str) -> str:
    return VLAN_PREFIX + _short(network_id)


def host_veth(attachment: str) -> str:
    """The host end of a pod's veth: a digest of the attachment (container id + ifname)."""
    return "pwp" + hashlib.sha256(attachment.encode()).hexdigest()[:12]


def memif_tap(attachment: str) -> str:
    """The host end of a pod's memif port, a tap the memif master makes: a digest of the
    memif's attachment, like a pod veth's; not ``schema.ports.tap_name``, the tap of a port
    someone else (a VM, a Neutron agent) makes."""
    return "pwt" + hashlib.sha256(attachment.encode()).hexdigest()[:12]


def is_pod_veth(name: str) -> bool:
    return name.startswith("pwp") and len(name) == 15


def is_memif_tap(name: str) -> bool:
    return name.startswith("pwt") and len(name) == 15


def stable_mac(purpose: str, name: str) -> str:
    """A locally administered unicast MAC that is a function of ``name``: set once, it never
    needs reading back, and a device carrying it never takes another (a bridge would
    otherwise take its lowest port's MAC, and the kernel flushes a device's neighbour
    entries whenever its address changes)."""
    digest = hashlib.sha256(f"podwire-{purpose}:{name}".encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def bridge_mac(bridge_name: str) -> str:
    return stable_mac("bridge", bridge_name)
