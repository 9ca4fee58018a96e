"""Names and marks of the veth pairs the interface driver makes (no Neutron imports).

The host end is ``schema.ports.tap_name`` of the port (Nova's naming, 14 characters), the name
podwire's node agent adopts as the port's tap. The end inside the agent's namespace carries
the mark ``podwire-ifdriver <host> <port id>`` as its alias: the node agent never touches that
end, so the mark survives whatever the agent does to the tap. A pair is removed only through a
marked namespace end of the same host (Neutron's agents of several simulated hosts may share a
``qdhcp-`` namespace on one machine), and deleting that end removes the tap with it.
"""

from __future__ import annotations

MARK_PREFIX = "podwire-ifdriver"


def mark(host: str, port_id: str) -> str:
    return f"{MARK_PREFIX} {host} {port_id}"


def marked_port(alias: str | None, host: str) -> str | None:
    """The port id if ``alias`` is this driver's mark for ``host``, else None."""
    parts = (alias or "").split(" ")
    if len(parts) == 3 and parts[0] == MARK_PREFIX and parts[1] == host and parts[2]:
        return parts[2]
    return None
