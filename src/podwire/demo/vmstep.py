"""The VM step: a QEMU VM on host 1 gets its address from Neutron's DHCP agent, a pod answers.

Neutron's real DHCP agent runs for host 1 (``podwire neutron-agent dhcp``, started with the
other services so it has registered by now); the VM's port is a ``compute:nova`` port bound to
host 1, and its NIC the tap QEMU makes as libvirt does, which the agent adopts. A pod on host 2
pings the VM across VXLAN and the VM pings the pod.
"""

from __future__ import annotations

import re
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podwire.demo.topology import ping_times
from podwire.errors import PodwireError, StackError
from podwire.schema.ports import tap_name
from podwire.vm import launcher

PINGS = 20


@dataclass
class VmFigures:
    skipped: str = ""
    accel: str = ""
    boot_to_lease_s: float = 0.0
    discover_to_lease_ms: float = 0.0
    pod_to_vm: tuple[int, int, float] = (0, 0, 0.0)  # answered, sent, RTT p50 ms
    vm_to_pod: tuple[int, int] = (0, 0)

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"VM: skipped ({self.skipped})"]
        answered, sent, rtt = self.pod_to_vm
        return [
            f"VM ({self.accel}) on host 1: QEMU start -> DHCP lease from Neutron's DHCP agent"
            f" {self.boot_to_lease_s:.1f} s (DISCOVER -> lease {self.discover_to_lease_ms:.0f} ms)",
            f"VM pinged from a pod on host 2: {answered} of {sent} answered, RTT p50"
            f" {rtt:.2f} ms; the VM pinged the pod: {self.vm_to_pod[0]} of {self.vm_to_pod[1]}",
        ]


def missing() -> str:
    """Why the step cannot run here, or "" when it can."""
    return launcher.unavailable() or ""


def run(
    neutron: Any,
    project: str,
    network_id: str,
    security_group: str,
    host: tuple[str, str],
    client: tuple[str, str],
    work: Path,
) -> VmFigures:
    """``host``: (name, namespace) of the VM's host; ``client``: (namespace, ip) of a pod."""
    port = neutron.network.create_port(
        network_id=network_id, project_id=project, device_owner="compute:nova",
        device_id=str(uuid.uuid4()), binding_host_id=host[0],
        security_group_ids=[security_group],
    )  # fmt: skip
    spec = launcher.VmSpec("demo-vm", tap_name(port.id), port.mac_address, work / "vm", host[1])
    try:
        vm = launcher.start(spec)
    except PodwireError as exc:
        raise StackError(f"the VM did not start: {exc}") from exc
    try:
        lease = vm.wait_lease(timeout=120)
        address = port.fixed_ips[0]["ip_address"]
        if str(lease.address.ip) != address:
            raise StackError(f"the VM got {lease.address}, its port has {address}")
        _wait_active(neutron, port.id)
        times = vm.boot_times()
        figures = VmFigures(
            accel=vm.accel.name,
            boot_to_lease_s=times.lease or 0.0,
            discover_to_lease_ms=lease.discover_to_lease * 1000,
        )
        figures.pod_to_vm = _ping_from(client[0], address)
        out = vm.run(f"ping -c 5 -W 2 {client[1]}").output
        received = re.search(r"(\d+) packets received", out)
        figures.vm_to_pod = (int(received.group(1)) if received else 0, 5)
        return figures
    finally:
        vm.kill()


def _wait_active(neutron: Any, port_id: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while neutron.network.get_port(port_id).status != "ACTIVE":
        if time.monotonic() > deadline:
            raise StackError(f"the VM's port {port_id} is not ACTIVE after {timeout:.0f} s")
        time.sleep(0.1)


def _ping_from(netns: str, address: str) -> tuple[int, int, float]:
    rtts = ping_times(netns, address, PINGS)
    return len(rtts), PINGS, statistics.median(rtts) if rtts else 0.0
