"""One simulated host with a podwire-named bridge and pods on it, for the dataplane tests of
security groups (the compiled ruleset applied by libnftables in the host namespace).

Every pod has the MAC, addresses and host veth name the agent would give it; what a port's
``DesiredPort`` says is derived from the same values, so a test states a policy and checks
packets without an agent or a stack.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from podwire.agent.policy.enforcer import PolicyEnforcer
from podwire.schema.ports import AddressPair, DesiredPort, FixedIp
from podwire.sgpolicy.compile import PortPolicy
from tests.agent.netenv import NetEnv, in_ns

ECHO = str(Path(__file__).with_name("echopeer.py"))
NETWORK = "7e57a11e-0000-4000-8000-000000000000"


@dataclass
class SgPod:
    ns: str
    ifname: str
    mac: str
    ip4: str
    ip6: str
    index: int
    pairs: tuple[AddressPair, ...] = ()
    security_groups: tuple[str, ...] = ()
    port_security: bool = True

    @property
    def port_id(self) -> str:
        return f"7e57a11e-0000-4000-8000-{self.index:012d}"

    def policy(self) -> PortPolicy:
        port = DesiredPort(
            self.port_id,
            NETWORK,
            self.mac,
            1500,
            "vxlan",
            None,
            100,
            "veth",
            (
                FixedIp(self.ip4, "s4", "10.9.0.0/24", None),
                FixedIp(self.ip6, "s6", "fd00:9::/64", None),
            ),
            self.security_groups,
            port_security_enabled=self.port_security,
            allowed_address_pairs=self.pairs,
        )
        return PortPolicy(port, self.ifname)


@dataclass
class SgHost:
    env: NetEnv
    ns: str = ""
    bridge: str = "pwbr7e57a11e000"
    pods: list[SgPod] = field(default_factory=list)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self) -> None:
        self.ns = self.env.namespace("sgh")
        in_ns(self.ns, "ip", "link", "add", self.bridge, "type", "bridge")
        in_ns(self.ns, "ip", "link", "set", self.bridge, "up")

    def pod(self, index: int, **extra: object) -> SgPod:
        ns = self.env.namespace(f"p{index}")
        pod = SgPod(
            ns,
            f"pwp7e57{index:08d}",
            f"fa:16:3e:00:00:{index:02x}",
            f"10.9.0.{index}",
            f"fd00:9::{index:x}",
            index,
            **extra,  # type: ignore[arg-type]
        )
        in_ns(self.ns, "ip", "link", "add", pod.ifname, "type", "veth", "peer", "name", "eth0")
        in_ns(self.ns, "ip", "link", "set", "eth0", "netns", ns)
        in_ns(self.ns, "ip", "link", "set", pod.ifname, "master", self.bridge, "up")
        in_ns(ns, "ip", "link", "set", "eth0", "address", pod.mac)
        in_ns(ns, "ip", "addr", "add", f"{pod.ip4}/24", "dev", "eth0")
        in_ns(ns, "ip", "addr", "add", f"{pod.ip6}/64", "dev", "eth0", "nodad")
        in_ns(ns, "sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0")
        in_ns(ns, "ip", "link", "set", "eth0", "up")
        self.pods.append(pod)
        return pod

    def serve(self, pod: SgPod, proto: str, port: int) -> None:
        argv = ["ip", "netns", "exec", pod.ns, sys.executable, ECHO, "serve", proto, str(port)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        self.procs.append(proc)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def numbered_ports(count: int, sgs: tuple[str, ...]) -> list[tuple[DesiredPort, str]]:
    """``count`` ports in ``sgs`` with distinct MACs, addresses and veth names (no pods made):
    the load of the restart and rule-change measurements."""
    out = []
    for i in range(1, count + 1):
        pod = SgPod(
            "",
            f"pwp7e57{i:08d}",
            f"fa:16:3e:00:{i // 256:02x}:{i % 256:02x}",
            f"10.9.{i // 256}.{i % 256}",
            f"fd00:9::{i:x}",
            i,
            security_groups=sgs,
        )
        policy = pod.policy()
        out.append((policy.port, policy.ifname))
    return out


async def wait_applied(enforcer: PolicyEnforcer, revision: int) -> None:
    """Until the policy as of etcd ``revision`` is in force: the moment a measurement ends,
    which the agent itself never waits for (an ADD waits for its own port's rules)."""
    async with enforcer.changed:
        await enforcer.changed.wait_for(lambda: enforcer.revision >= revision)


def nft_shape(listing: str) -> str:
    """A JSON ruleset listing without handles and counters, its lists sorted: two listings of
    the same rules compare equal however they were applied."""

    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {
                k: strip(v) for k, v in value.items() if k not in ("handle", "packets", "bytes")
            }
        if isinstance(value, list):
            return sorted((strip(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
        return value

    return json.dumps(strip(json.loads(listing)), sort_keys=True)


def reaches(pod: SgPod, proto: str, address: str, port: int, source: str = "") -> bool:
    """Whether one flow from ``pod`` to ``address`` gets an echo back."""
    argv = ["ip", "netns", "exec", pod.ns, sys.executable, ECHO, "client", proto, address]
    argv += [str(port)] + ([source] if source else [])
    proc = subprocess.run(argv, input="ping\n", capture_output=True, text=True, timeout=15)
    return proc.stdout.splitlines()[:2] == ["connected", "ping"]


def ping(pod: SgPod, address: str, source: str = "") -> bool:
    argv = ["ping", "-c1", "-W1", *(["-I", source] if source else []), address]
    return in_ns(pod.ns, *argv, check=False).returncode == 0
