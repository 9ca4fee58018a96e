"""The memif step: a CNF pod (DPDK testpmd, icmpecho) made through Kubernetes on host 1
answers a veth pod on host 2.

Kubelet hands out the ``podwire.io/memif`` grant (Allocate, from host 1's agent's device
plugin); the pod's CNI ADD gives the memif its Neutron port and writes ``memif.json`` into
the grant's dir, where this step reads the address it pings.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from podwire.demo.topology import ping_times
from podwire.errors import StackError
from podwire.kube import cnf
from podwire.memif import build as memif_build


def missing() -> str:
    """Why the step cannot run on this machine, or "" when it can."""
    if not cnf.available():
        return "dpdk-testpmd or DPDK's memif PMD not found (Debian dpdk-dev)"
    if memif_build.find() is None:
        return "podwire-memif not built (scripts/setup builds it)"
    return ""


def settings_toml(kubelet_root: Path, work: Path, devices: int = 4) -> str:
    """The agent's [deviceplugin] section for the node's kubelet (its dirs made now: the
    plugin registers once kubelet listens there)."""
    (kubelet_root / "device-plugins").mkdir(parents=True, exist_ok=True)
    return (
        f"[deviceplugin]\nenabled = true\ndevices = {devices}\n"
        f'device_plugins_dir = "{kubelet_root / "device-plugins"}"\n'
        f'pod_resources_socket = "{kubelet_root / "pod-resources" / "kubelet.sock"}"\n'
        f'memif_host_dir = "{work / "memif"}"\n'
        f'checkpoint = "{work / "memif-checkpoint.json"}"\n'
    )


def memif_address(memif_dir: Path, timeout: float = 30.0) -> str:
    """The memif's address from the grant's ``memif.json`` (written at the pod's CNI ADD)."""
    deadline = time.monotonic() + timeout
    while not (found := sorted(memif_dir.glob("*/memif.json"))):
        if time.monotonic() > deadline:
            raise StackError(f"no memif.json under {memif_dir} after {timeout:.0f} s")
        time.sleep(0.2)
    return str(json.loads(found[0].read_text())["ips"][0]).split("/")[0]


@dataclass
class CnfFigures:
    skipped: str = ""
    answered: int = 0
    sent: int = 0
    rtt_ms: list[float] = field(default_factory=list)

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"memif CNF: skipped, {self.skipped}"]
        ordered = sorted(self.rtt_ms)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        return [
            f"memif CNF pod (dpdk-testpmd icmpecho, via kubelet's Allocate) on host 1, pinged"
            f" from host 2: {self.answered} of {self.sent} answered,"
            f" RTT p50 {statistics.median(self.rtt_ms):.2f} ms, p99 {p99:.2f} ms"
        ]


def ping_cnf(client_netns: str, address: str, count: int, logs: str) -> CnfFigures:
    """``logs``: where testpmd's output is, for the error."""
    if not _answers_within(client_netns, address, 20.0):
        raise StackError(f"the memif CNF at {address} never answered ({logs})")
    samples = ping_times(client_netns, address, count)
    if not samples:
        raise StackError(f"the memif CNF at {address} stopped answering ({logs})")
    return CnfFigures(answered=len(samples), sent=count, rtt_ms=samples)


def _answers_within(netns: str, address: str, seconds: float) -> bool:
    command = ["ip", "netns", "exec", netns, "ping", "-c", "1", "-W", "1", "-q", address]
    for _ in range(int(seconds)):
        if subprocess.run(command, capture_output=True, check=False).returncode == 0:
            return True
    return False
