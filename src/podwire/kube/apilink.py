"""The link between a simulated host's namespace and the machine's, for kubelet and the
apiserver to reach each other.

A simulated host cannot reach the machine's addresses (its underlay is a bridge of its own),
yet its kubelet must reach the apiserver, and the apiserver the kubelet (exec, logs, at the
Node's InternalIP). A veth pair joins the two namespaces with one host route at each end: in
the host's namespace to the apiserver's address, in the machine's to the host's address. No
addresses are added: each end's kernel answers ARP for its own namespace's addresses, and the
routes name the source, so both sides keep the addresses they already have. Deleting the
machine's end deletes the pair and both routes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass

from podwire.errors import KubeError

HOST_END = "pwkube0"


def _ip(*argv: str, netns: str = "") -> str:
    command = ["ip", *(("-n", netns) if netns else ()), *argv]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KubeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


def machine_end(netns: str) -> str:
    """The machine's end, named after the namespace (15 characters at most)."""
    return "pwk" + hashlib.sha256(netns.encode()).hexdigest()[:10]


def host_address(netns: str) -> str:
    """The first global IPv4 address in ``netns`` (the host's underlay address)."""
    links = json.loads(_ip("-j", "-4", "addr", "show", "scope", "global", netns=netns) or "[]")
    for link in links:
        if link.get("ifname") == HOST_END:
            continue
        for info in link.get("addr_info", []):
            return str(info["local"])
    raise KubeError(
        f"the namespace {netns} has no global IPv4 address for kubelet's --node-ip; give one"
        " with --node-ip"
    )


def exists(netns: str) -> bool:
    done = subprocess.run(
        ["ip", "link", "show", machine_end(netns)], capture_output=True, check=False
    )
    return done.returncode == 0


@dataclass(frozen=True)
class ApiLink:
    netns: str
    node_ip: str  # the host's address, kubelet's --node-ip
    api_ip: str  # the apiserver's advertised address, in the machine's namespace

    def check_free(self) -> None:
        if exists(self.netns):
            raise KubeError(
                f"a link {machine_end(self.netns)} to {self.netns} exists already: another"
                " kube-node serves that namespace"
            )

    def create(self) -> None:
        self.check_free()
        outer = machine_end(self.netns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", HOST_END, "netns", self.netns)
        try:
            _ip("link", "set", outer, "up")
            _ip("link", "set", HOST_END, "up", netns=self.netns)
            _ip("route", "add", f"{self.api_ip}/32", "dev", HOST_END, "src", self.node_ip,
                netns=self.netns)  # fmt: skip
            self._route_to_host(outer)
        except KubeError:
            self.delete()
            raise

    def _route_to_host(self, outer: str) -> None:
        try:
            _ip("route", "add", f"{self.node_ip}/32", "dev", outer, "src", self.api_ip)
        except KubeError as exc:
            raise KubeError(
                f"the machine's namespace has a route to {self.node_ip} already (another"
                f" kube-node for a host of that address?): {exc}"
            ) from exc

    def delete(self) -> None:
        """The pair and its routes; nothing if already gone."""
        if exists(self.netns):
            _ip("link", "del", machine_end(self.netns))
