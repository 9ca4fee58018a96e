"""The security-group step: Neutron's API decides which TCP connections reach a pod.

A pod in a group without an ingress TCP rule listens on a port; a pod on the other host
connects. A pod of the open group with nothing listening answers with a reset (refused): the
network delivers. The locked pod's SYNs are dropped (timed out). The demo then creates the rule
through Neutron and measures from the create call's return to the first connection accepted.
Last, the client claims an address its port does not own: port security drops it, although the
new rule's prefix would admit that address.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass
from typing import Any

from podwire.demo import probes
from podwire.demo.pods import Pod
from podwire.demo.topology import ip
from podwire.errors import StackError

TCP_PORT = 8080
_PROBE_EVERY = 0.05  # seconds per attempt while waiting for the rule: the figure's resolution


@dataclass(frozen=True)
class SgFigures:
    open_outcome: str
    locked_outcome: str
    in_force_ms: float
    spoofed: str  # the source address the client pretended to have
    spoofed_outcome: str

    def lines(self) -> list[str]:
        return [
            f"security groups, tcp/{TCP_PORT} from host 2: open group, nothing listening:"
            f" {self.open_outcome}; listening pod, group without that rule: {self.locked_outcome}"
            " (dropped)",
            f"security groups: Neutron rule create returned -> first connection accepted:"
            f" {self.in_force_ms:.0f} ms (probing every {_PROBE_EVERY * 1000:.0f} ms)",
            f"security groups: the same connection from a spoofed source {self.spoofed}"
            f" (inside the rule's prefix): {self.spoofed_outcome} (dropped by port security)",
        ]


def create_locked_group(neutron: Any, project: str) -> str:
    """A new group: Neutron gives it egress rules only, so nothing gets in."""
    group = neutron.network.create_security_group(name="demo-locked", project_id=project)
    return str(group.id)


def run(neutron: Any, group: str, server: Pod, open_pod: Pod, client: Pod, cidr: str) -> SgFigures:
    listener = probes.start_listener(server.netns, TCP_PORT)
    try:
        refused = probes.connect(client.netns, open_pod.ip, TCP_PORT, each=2.0)
        dropped = probes.connect(client.netns, server.ip, TCP_PORT, each=2.0)
        _expect("refused", refused, "to an open pod with nothing listening")
        _expect("timed out", dropped, "to a pod whose group has no ingress rule")
        in_force_ms = _admit(neutron, group, server, client, cidr)
        spoofed = _unused_address(neutron, cidr)
        spoof = _from_spoofed(client, server, spoofed)
        _expect("timed out", spoof, f"from the spoofed source {spoofed}")
    finally:
        probes.stop(listener)
    return SgFigures(refused.outcome, dropped.outcome, in_force_ms, spoofed, spoof.outcome)


def _expect(outcome: str, probe: probes.Probe, what: str) -> None:
    if probe.outcome != outcome:
        raise StackError(f"tcp/{TCP_PORT} {what}: {probe.outcome}, expected {outcome}")


def _admit(neutron: Any, group: str, server: Pod, client: Pod, cidr: str) -> float:
    """Create the rule while the client keeps trying; milliseconds from the create's return."""
    waiting = probes.start_connect(client.netns, server.ip, TCP_PORT, _PROBE_EVERY, 30.0)
    try:
        neutron.network.create_security_group_rule(
            security_group_id=group,
            direction="ingress",
            ethertype="IPv4",
            protocol="tcp",
            port_range_min=TCP_PORT,
            port_range_max=TCP_PORT,
            remote_ip_prefix=cidr,
        )
        returned = time.monotonic()
    finally:
        admitted = probes.finish_connect(waiting, client.netns)
    _expect("connected", admitted, "30 s after the rule create")
    return (admitted.at - returned) * 1000


def _unused_address(neutron: Any, cidr: str) -> str:
    network = ipaddress.ip_network(cidr)
    used = {ip["ip_address"] for port in neutron.network.ports() for ip in port.fixed_ips}
    return next(str(a) for a in reversed(list(network.hosts())) if str(a) not in used)


def _from_spoofed(client: Pod, server: Pod, spoofed: str) -> probes.Probe:
    """The client claims an address its port does not have (the rule's prefix admits it)."""
    ip("ip", "addr", "add", f"{spoofed}/32", "dev", "eth0", netns=client.netns)
    try:
        return probes.connect(client.netns, server.ip, TCP_PORT, each=2.0, source=spoofed)
    finally:
        ip("ip", "addr", "del", f"{spoofed}/32", "dev", "eth0", netns=client.netns)
