"""``podwire neutron-agent dhcp|l3`` run by a test, and what the tests read of the DHCP agent."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import PODWIRE
from tests.neutron_agents.netinfo import links

DHCP_OWNER = "network:dhcp"


class NeutronAgentRun:
    """The command in the foreground, as an operator runs it; ``stop`` sends SIGTERM."""

    def __init__(
        self,
        data_dir: Path,
        host: str,
        netns: str,
        out: Path,
        adopt_timeout: float = 10.0,
        kind: str = "dhcp",
    ) -> None:
        self.host = host
        self.kind = kind
        self.console = out.open("ab")
        self.proc = subprocess.Popen(
            [
                *PODWIRE, "neutron-agent", kind, "--data-dir", str(data_dir),
                "--host", host, "--netns", netns, "--adopt-timeout", str(adopt_timeout),
            ],
            stdout=subprocess.PIPE,
            stderr=self.console,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"neutron-agent {kind} exited with {self.proc.wait()}; see {out}"
        self.info: dict[str, Any] = json.loads(line)

    @property
    def log_text(self) -> str:
        return Path(self.info["log"]).read_text(errors="replace")

    def dnsmasq_pid(self, network_id: str) -> int | None:
        try:
            return int((Path(self.info["state_path"]) / "dhcp" / network_id / "pid").read_text())
        except (OSError, ValueError):
            return None

    def stop(self, timeout: float = 90.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        self.console.close()
        return code


def dhcp_port(neutron: Any, network_id: str) -> Any:
    ports = list(neutron.network.ports(network_id=network_id, device_owner=DHCP_OWNER))
    return ports[0] if ports else None


def taps(netns: str) -> dict[str, dict[str, Any]]:
    return {name: link for name, link in links(netns).items() if name.startswith("tap")}
