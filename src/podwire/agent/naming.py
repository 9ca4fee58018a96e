"""Names of the interfaces the agent owns (at most 15 characters, IFNAMSIZ - 1).

Names are derived, never random, so a restarted agent finds its own interfaces again and two
agents never compete for one name. The ``pw`` prefix marks them as podwire's.
"""

from __future__ import annotations

import hashlib


def _short(value: str) -> str:
    return value.replace("-", "")[:11]


def bridge(network_id: str) -> str:
    return f"pwbr{_short(network_id)}"


def vxlan(network_id: str) -> str:
    return f"pwvx{_short(network_id)}"


def vlan(network_id: str) -> str:
    return f"pwvl{_short(network_id)}"


def host_veth(attachment: str) -> str:
    """The host end of a pod's veth: a digest of the attachment (container id + ifname)."""
    return "pwp" + hashlib.sha256(attachment.encode()).hexdigest()[:12]


def is_pod_veth(name: str) -> bool:
    return name.startswith("pwp") and len(name) == 15
