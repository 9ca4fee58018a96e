"""The router step: pods on two networks talk through a Neutron router, the outside reaches one.

Neutron's own L3 agent runs for host 1 (``podwire neutron-agent l3``, started with the other
services so it has registered by now). Host 1's agent maps the physnet ``demoext`` to
``phys0``, one end of a veth whose other end is an "outside" namespace at ``OUTSIDE_IP``. The
step makes, through Neutron's API only: a flat external network on that physnet, a second
tenant network, and a router with its gateway there and an interface on each tenant network.
A pod on the second network (host 2) pings a pod of the first network (host 1) through the
router, and pings the outside through the router's source NAT; then a floating IP associated
with its port makes it answer the outside, which measures associate -> first answer.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podwire.demo.topology import ip, pings
from podwire.errors import StackError

PHYSNET = "demoext"
UPLINK = "phys0"
OUTSIDE_IP = "203.0.113.1"
EXTERNAL_CIDR = "203.0.113.0/24"
SECOND_CIDR = "10.89.0.0/24"
PINGS = 5


@dataclass
class RouterFigures:
    skipped: str = ""
    through_router: tuple[int, int] = (0, 0)
    snat: bool = False
    gateway_ip: str = ""
    floating_ip: str = ""
    associate_to_answer_ms: float = 0.0
    l3_agent_ms: float | None = None  # its own figure for the router update it made

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"router: skipped ({self.skipped})"]
        answered, sent = self.through_router
        return [
            f"router (Neutron's L3 agent on host 1): a pod on network 2 (host 2) pinged a pod on"
            f" network 1 (host 1): {answered} of {sent} answered; it pinged the outside"
            f" through SNAT as {self.gateway_ip}: {'answered' if self.snat else 'no answer'}",
            f"floating IP {self.floating_ip}: associate returned -> first answer from outside"
            f" {self.associate_to_answer_ms:.0f} ms (Neutron's L3 agent processing that router"
            f" update: {_ms(self.l3_agent_ms)})",
        ]


def _ms(value: float | None) -> str:
    return "not logged" if value is None else f"{value:.0f} ms"


# The L3 agent's own timing line (neutron/agent/l3/agent.py logs it at INFO).
ROUTER_UPDATE = re.compile(
    r"Finished a router update for (\S+), update_id \S+\. Time elapsed: ([\d.]+)"
)


def router_updates(log: Path, router_id: str) -> list[float]:
    """Seconds the L3 agent spent on each update of ``router_id`` so far, in order."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [float(s) for r, s in ROUTER_UPDATE.findall(text) if r == router_id]


def missing() -> str:
    """Why the step cannot run here, or "" when it can: Neutron's L3 agent needs these."""
    absent = [tool for tool in ("iptables", "conntrack", "arping") if shutil.which(tool) is None]
    return f"{', '.join(absent)} not installed" if absent else ""


def agent_toml() -> str:
    """Host 1's agent: the external physnet on its uplink to the outside."""
    return f'physnet_mappings = {{ {PHYSNET} = "{UPLINK}" }}\n'


def make_outside(host_ns: str, outside_ns: str) -> None:
    """The uplink ``phys0`` in the host, its other end the outside's ``eth0``."""
    ip("ip", "link", "add", UPLINK, "type", "veth", "peer", "name", "eth0", "netns", outside_ns,
       netns=host_ns)  # fmt: skip
    ip("ip", "link", "set", UPLINK, "up", netns=host_ns)
    ip("ip", "addr", "add", f"{OUTSIDE_IP}/24", "dev", "eth0", netns=outside_ns)
    ip("ip", "link", "set", "eth0", "up", netns=outside_ns)


def public_group(neutron: Any, project: str) -> str:
    """Pings from anywhere: what reaches the pod through its floating IP is still filtered
    by its groups, and the demo's own group admits only its members."""
    group = neutron.network.create_security_group(name="demo-public", project_id=project)
    neutron.network.create_security_group_rule(
        security_group_id=group.id, direction="ingress", ethertype="IPv4", protocol="icmp"
    )
    return str(group.id)


def build(neutron: Any, project: str, first_network: str) -> tuple[Any, Any]:
    """The external network, network 2 and the router; returns (network 2, router)."""
    net = neutron.network
    external = net.create_network(
        name="demo-outside", project_id=project, provider_network_type="flat",
        provider_physical_network=PHYSNET, is_router_external=True,
    )  # fmt: skip
    net.create_subnet(
        network_id=external.id, cidr=EXTERNAL_CIDR, ip_version=4, project_id=project,
        gateway_ip=OUTSIDE_IP, is_dhcp_enabled=False,
        allocation_pools=[{"start": "203.0.113.10", "end": "203.0.113.99"}],
    )  # fmt: skip
    second = net.create_network(name="demo-pods-2", project_id=project)
    net.create_subnet(network_id=second.id, cidr=SECOND_CIDR, ip_version=4, project_id=project)
    router = net.create_router(
        name="demo-router", project_id=project, external_gateway_info={"network_id": external.id}
    )
    for network_id in (first_network, second.id):
        for subnet in net.subnets(network_id=network_id):
            net.add_interface_to_router(router, subnet_id=subnet.id)
    _wait_router_ports(neutron, router.id, 3)
    return second, net.get_router(router.id)


def check(
    neutron: Any,
    project: str,
    router: Any,
    client: tuple[str, str],
    target: str,
    outside: str,
    l3_log: Path,
) -> RouterFigures:
    """``client``: (namespace, port id) of the pod on network 2; ``target``: a pod's address
    on network 1; ``l3_log``: the L3 agent's log file."""
    netns, port_id = client
    figures = RouterFigures(gateway_ip=_gateway_ip(router))
    figures.through_router = (_answered(netns, target), PINGS)
    figures.snat = _settles(netns, OUTSIDE_IP, 30.0) is not None
    external = router.external_gateway_info["network_id"]
    floating = neutron.network.create_ip(floating_network_id=external, project_id=project)
    figures.floating_ip = floating.floating_ip_address
    seen = len(router_updates(l3_log, router.id))
    neutron.network.update_ip(floating, port_id=port_id)
    started = time.perf_counter()
    if _settles(outside, figures.floating_ip, 60.0) is None:
        raise StackError(f"the outside did not reach floating IP {figures.floating_ip}")
    figures.associate_to_answer_ms = (time.perf_counter() - started) * 1000
    figures.l3_agent_ms = _next_update(l3_log, router.id, seen)
    return figures


def _next_update(l3_log: Path, router_id: str, seen: int, within: float = 30.0) -> float | None:
    """The L3 agent's own milliseconds for the update after the ``seen`` first ones: the
    answer can come before the agent has logged it (the NAT rules go in before the rest)."""
    deadline = time.monotonic() + within
    while len(updates := router_updates(l3_log, router_id)) <= seen:
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)
    return updates[seen] * 1000


def _gateway_ip(router: Any) -> str:
    return str(router.external_gateway_info["external_fixed_ips"][0]["ip_address"])


def _answered(netns: str, address: str) -> int:
    _settles(netns, address, 30.0)  # the first answer may wait for the router's ARP
    return sum(pings(netns, address) for _ in range(PINGS))


def _settles(netns: str, address: str, within: float) -> float | None:
    """Seconds until ``address`` answers a ping from ``netns`` (None: not within)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        probe = subprocess.run(
            ["ip", "netns", "exec", netns, "ping", "-c", "1", "-W", "0.2", "-q", address],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return time.monotonic() - started
    return None


def _wait_router_ports(neutron: Any, router_id: str, count: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ports = list(neutron.network.ports(device_id=router_id))
        if len(ports) == count and all(p.status == "ACTIVE" for p in ports):
            return
        if time.monotonic() > deadline:
            states = ", ".join(f"{p.device_owner} {p.status}" for p in ports)
            raise StackError(f"the router's ports are not ACTIVE after {timeout:.0f} s: {states}")
        time.sleep(0.2)
