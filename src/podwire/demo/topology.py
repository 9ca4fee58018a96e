"""Namespaces for the demo: simulated hosts on an underlay bridge, and pods.

This is scaffolding around podwire (what a real cluster already has), so it drives iproute2
directly; everything it creates carries one tag and is removed by ``destroy``.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from dataclasses import dataclass, field

from podwire.errors import StackError


def ip(*argv: str, netns: str | None = None) -> str:
    command = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StackError(f"{' '.join(command)}: {result.stderr.strip()}")
    return result.stdout


@dataclass
class Topology:
    tag: str = field(default_factory=lambda: f"pwd{uuid.uuid4().hex[:5]}")
    namespaces: list[str] = field(default_factory=list)

    def namespace(self, suffix: str) -> str:
        name = f"{self.tag}-{suffix}"
        ip("ip", "netns", "add", name)
        self.namespaces.append(name)
        ip("ip", "link", "set", "lo", "up", netns=name)
        return name

    def build_hosts(self, count: int) -> list[tuple[str, str]]:
        """``count`` host namespaces on one underlay bridge; returns (netns, underlay ip)."""
        underlay = self.namespace("ul")
        ip("ip", "link", "add", "ul0", "type", "bridge", netns=underlay)
        ip("ip", "link", "set", "ul0", "up", netns=underlay)
        hosts = []
        for index in range(1, count + 1):
            ns = self.namespace(f"h{index}")
            address = f"192.0.2.{10 + index}"
            peer = f"ul{index}"
            ip("ip", "link", "add", "eth0", "type", "veth", "peer", "name", peer,
               "netns", underlay, netns=ns)  # fmt: skip
            ip("ip", "addr", "add", f"{address}/24", "dev", "eth0", netns=ns)
            ip("ip", "link", "set", "eth0", "up", netns=ns)
            ip("ip", "link", "set", peer, "master", "ul0", "up", netns=underlay)
            hosts.append((ns, address))
        return hosts

    def pod(self, name: str) -> str:
        return self.namespace(name)

    def remove(self, name: str) -> None:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        if name in self.namespaces:
            self.namespaces.remove(name)

    def destroy(self) -> None:
        for name in reversed(list(self.namespaces)):
            self.remove(name)

    def leftovers(self, routers: list[str]) -> list[str]:
        """Namespaces of ours still there, and ``routers``' ``qrouter-`` namespaces."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        names = [line.split()[0] for line in listed.splitlines() if line.strip()]
        theirs = {f"qrouter-{router}" for router in routers}
        return [name for name in names if name.startswith(self.tag) or name in theirs]


def ping_times(netns: str, address: str, count: int) -> list[float]:
    """The RTTs (ms) of ``count`` echoes, 50 ms apart; lost ones are missing."""
    result = subprocess.run(
        [*("ip", "netns", "exec", netns), "ping", "-n", "-c", str(count), "-i", "0.05", address],
        capture_output=True,
        text=True,
        check=False,
    )
    return [float(ms) for ms in re.findall(r"time=([\d.]+) ms", result.stdout)]


def pings(netns: str, address: str) -> bool:
    result = subprocess.run(
        ["ip", "netns", "exec", netns, "ping", "-c", "1", "-W", "2", "-q", address],
        capture_output=True,
        check=False,
    )
    return result.returncode == 0
