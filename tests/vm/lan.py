"""A simulated host for VM tests: a bridge in the host's namespace, a server namespace on it.

The test itself plays the podwire agent's part: it puts the tap QEMU created on the bridge and
brings it up. The server namespace (192.0.2.0/24 is the underlay's, so 10.99.0.0/24 here) holds
a real dnsmasq (Debian dnsmasq-base, as Neutron's DHCP agent runs it) answering the VM's MAC
with a fixed address. Everything carries the NetEnv's unique tag and goes at clean-up.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from podwire.stack import procs
from tests.agent.netenv import NetEnv, in_ns, links_in

SUBNET = "10.99.0"
SERVER = f"{SUBNET}.1"
VM_ADDRESS = f"{SUBNET}.5"
BRIDGE = "br0"


@dataclass
class Lan:
    env: NetEnv
    host: str  # the simulated host's namespace: QEMU runs here, its tap appears here
    server: str  # a namespace on the bridge: dnsmasq, and a peer to ping

    def plug(self, tap: str, timeout: float = 10.0) -> None:
        """What the agent would do: wait for QEMU's tap, put it on the bridge, bring it up."""
        deadline = time.monotonic() + timeout
        while tap not in links_in(self.host):
            if time.monotonic() > deadline:
                raise AssertionError(f"QEMU created no {tap} in {self.host}")
            time.sleep(0.02)
        in_ns(self.host, "ip", "link", "set", tap, "master", BRIDGE, "up")

    def peer_namespace(self, suffix: str) -> str:
        """Another namespace with an interface on the bridge, unconfigured (a DHCP client)."""
        ns = self.env.namespace(suffix)
        in_ns(ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", f"v{suffix}")
        in_ns(ns, "ip", "link", "set", f"v{suffix}", "netns", self.host)
        in_ns(ns, "ip", "link", "set", "eth0", "up")
        in_ns(self.host, "ip", "link", "set", f"v{suffix}", "master", BRIDGE, "up")
        return ns


def build(env: NetEnv) -> Lan:
    host = env.namespace("host")
    server = env.namespace("srv")
    in_ns(host, "ip", "link", "add", BRIDGE, "type", "bridge")
    in_ns(host, "ip", "link", "set", BRIDGE, "up")
    in_ns(server, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "vsrv")
    in_ns(server, "ip", "link", "set", "vsrv", "netns", host)
    in_ns(server, "ip", "addr", "add", f"{SERVER}/24", "dev", "eth0")
    in_ns(server, "ip", "link", "set", "eth0", "up")
    in_ns(host, "ip", "link", "set", "vsrv", "master", BRIDGE, "up")
    return Lan(env, host, server)


def start_dnsmasq(lan: Lan, work: Path, hosts: dict[str, str]) -> subprocess.Popen[bytes]:
    """dnsmasq in the server namespace: DHCP only, ``hosts`` maps MACs to fixed addresses."""
    argv = [
        *("ip", "netns", "exec", lan.server, "dnsmasq", "--keep-in-foreground"),
        *("--conf-file=/dev/null", "--port=0", "--interface=eth0", "--bind-interfaces"),
        f"--dhcp-range={SUBNET}.100,{SUBNET}.150,255.255.255.0,300s",
        f"--dhcp-option=option:router,{SERVER}",
        "--dhcp-option=option:mtu,1400",
        f"--dhcp-leasefile={work / 'leases'}",
        f"--pid-file={work / 'dnsmasq.pid'}",
        "--user=root",
        "--log-dhcp",
        "--log-facility=-",
        *(f"--dhcp-host={mac},{address}" for mac, address in hosts.items()),
    ]
    return procs.spawn(argv, work / "dnsmasq.log")
