"""The security-group step: Neutron's API decides which TCP connections reach a pod.

A pod in a group without an ingress TCP rule listens on a port; a pod on the other host
connects. A pod of the open group with nothing listening answers with a reset (refused): the
network delivers. The locked pod's SYNs are dropped (timed out). The demo then creates the rule
through Neutron and measures from the create call's return to the first connection accepted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from podwire.demo import probes
from podwire.demo.pods import Pod
from podwire.errors import StackError

TCP_PORT = 8080
_PROBE_EVERY = 0.05  # seconds per attempt while waiting for the rule: the figure's resolution


@dataclass(frozen=True)
class SgFigures:
    open_outcome: str
    locked_outcome: str
    in_force_ms: float

    def lines(self) -> list[str]:
        return [
            f"security groups, tcp/{TCP_PORT} from host 2: open group, nothing listening:"
            f" {self.open_outcome}; listening pod, group without that rule: {self.locked_outcome}"
            " (dropped)",
            f"security groups: Neutron rule create returned -> first connection accepted:"
            f" {self.in_force_ms:.0f} ms (probing every {_PROBE_EVERY * 1000:.0f} ms)",
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
        if refused.outcome != "refused" or dropped.outcome != "timed out":
            raise StackError(
                f"expected refused and timed out, got {refused.outcome} and {dropped.outcome}"
            )
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
    finally:
        probes.stop(listener)
    if admitted.outcome != "connected":
        raise StackError(f"tcp/{TCP_PORT} still {admitted.outcome} 30 s after the rule create")
    return SgFigures(refused.outcome, dropped.outcome, (admitted.at - returned) * 1000)
