"""Real namespaces for agent tests: simulated hosts on an underlay bridge, and pods.

Everything created here carries the test's own ``pwt-<random>`` prefix and is removed by the
fixture that made it, whether or not the test passed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def in_ns(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh("ip", "netns", "exec", ns, *argv, check=check)


def pings(ns: str, address: str, timeout: float = 3.0) -> bool:
    """Whether ``address`` answers an ICMP echo from inside ``ns`` within ``timeout``."""
    pinger = Path(__file__).with_name("pinger.py")
    proc = in_ns(ns, sys.executable, str(pinger), address, str(timeout), check=False)
    return proc.returncode == 0


async def ping_settles(ns: str, address: str, expected: bool = True, within: float = 5.0) -> bool:
    """Pings (each in a thread, so agents running in this event loop go on) until the
    answer is ``expected`` or ``within`` seconds have passed; returns the last answer."""
    deadline = time.monotonic() + within
    while True:
        result = await asyncio.to_thread(pings, ns, address, 1.0)
        if result == expected or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.2)


def links_in(ns: str) -> list[str]:
    out = in_ns(ns, "ip", "-o", "link", "show").stdout
    return [line.split(": ")[1].split("@")[0] for line in out.splitlines() if ": " in line]


@dataclass
class NetEnv:
    """Namespaces of one test. Host i has underlay address 192.0.2.<10+i>."""

    tag: str = field(default_factory=lambda: f"pwt-{uuid.uuid4().hex[:6]}")
    namespaces: list[str] = field(default_factory=list)
    underlay: str = ""

    def namespace(self, suffix: str) -> str:
        name = f"{self.tag}-{suffix}"
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        in_ns(name, "ip", "link", "set", "lo", "up")
        return name

    def host(self, index: int) -> tuple[str, str]:
        """A simulated host namespace joined to the underlay; returns (netns, vtep ip)."""
        if not self.underlay:
            self.underlay = self.namespace("ul")
            in_ns(self.underlay, "ip", "link", "add", "ul0", "type", "bridge")
            in_ns(self.underlay, "ip", "link", "set", "ul0", "up")
        ns = self.namespace(f"h{index}")
        vtep = f"192.0.2.{10 + index}"
        in_ns(
            ns,
            "ip",
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            f"ul{index}",
            "netns",
            self.underlay,
        )
        in_ns(ns, "ip", "addr", "add", f"{vtep}/24", "dev", "eth0")
        in_ns(ns, "ip", "link", "set", "eth0", "up")
        in_ns(self.underlay, "ip", "link", "set", f"ul{index}", "master", "ul0", "up")
        return ns, vtep

    def physnet_link(self, host_ns: str, name: str = "phys0") -> str:
        """A spare interface in a host namespace to serve a flat physnet."""
        in_ns(host_ns, "ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p")
        return name

    def cleanup(self) -> None:
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()
