"""The Services step: a pod on host 2 reaches the Service ``web`` by its name, answered by its
backends on both hosts. The name is resolved by the stack's CoreDNS through the kube-dns
Service; both translations happen in the client pod (its node's agent wrote them), and the
DNS server on the machine is reached through the router step's router: the outside namespace
routes on to the machine (``route_to_machine``), as a cloud's external network reaches its
control plane."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from podwire.demo.kube import NAMESPACE, Kube
from podwire.demo.topology import ip
from podwire.kube.manifests import toolbox_pod

PORT = 8080
PROBES = 16  # both backends answer unless 16 draws of 2 all fall alike: p = 3e-5
MACHINE_NET = ("100.67.0.1", "100.67.0.2")


@dataclass
class ServiceFigures:
    skipped: str = ""
    resolved: str = ""  # the address CoreDNS gave
    answered: list[str] = field(default_factory=list)  # each probe's backend (pod name)
    first_ms: float = 0.0

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"Services: skipped, {self.skipped}"]
        backends = sorted(set(self.answered))
        return [
            f"Services: web.{NAMESPACE}.svc.cluster.local -> {self.resolved or 'not resolved'}"
            f" (CoreDNS, through the kube-dns Service); {len(self.answered)} of {PROBES}"
            f" connections by name from host 2 answered, by {', '.join(backends) or 'nobody'};"
            f" first answer {self.first_ms:.0f} ms after the Service was applied",
        ]


def route_to_machine(outside_ns: str, external_cidr: str) -> None:
    """A link from the outside namespace to the machine: the router's source-NATed traffic
    to the machine's own addresses (the apiserver, CoreDNS) goes that way, and the machine
    answers the external network through it. Gone with the outside namespace."""
    machine, outside = f"{outside_ns.split('-')[0]}-m", "tomachine"
    ip("ip", "link", "add", machine, "type", "veth", "peer", "name", outside, "netns", outside_ns)
    ip("ip", "addr", "add", f"{MACHINE_NET[0]}/30", "dev", machine)
    ip("ip", "link", "set", machine, "up")
    ip("ip", "route", "replace", external_cidr, "via", MACHINE_NET[1])
    ip("ip", "addr", "add", f"{MACHINE_NET[1]}/30", "dev", outside, netns=outside_ns)
    ip("ip", "link", "set", outside, "up", netns=outside_ns)
    ip("ip", "route", "replace", "default", "via", MACHINE_NET[0], netns=outside_ns)
    ip("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=outside_ns)


def _server(name: str, host: str) -> dict[str, Any]:
    body = toolbox_pod(name, NAMESPACE, host)
    container = body["spec"]["containers"][0]
    container["command"] = ["sh", "-c", f"while true; do hostname | nc -l -p {PORT}; done"]
    body["metadata"].setdefault("labels", {})["app"] = "web"
    return body


def _service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {
            "selector": {"app": "web"},
            "ports": [{"protocol": "TCP", "port": 80, "targetPort": PORT}],
        },
    }


def run(kube: Kube, hosts: tuple[str, ...], client: str) -> ServiceFigures:
    """``client``: a running pod on the second host."""
    servers = {f"web-{i + 1}": host for i, host in enumerate(hosts)}
    kube.apply(*(_server(name, host) for name, host in servers.items()))
    kube.running(list(servers))
    started = time.perf_counter()
    kube.apply(_service())
    figures = ServiceFigures()
    name = f"web.{NAMESPACE}.svc.cluster.local"

    def resolved() -> str | None:
        out = kube.output(client, "nslookup", name) or ""
        found = [line.split()[-1] for line in out.splitlines() if line.startswith("Address")]
        return found[-1] if len(found) > 1 else None  # the first is the server's

    figures.resolved = kube.wait(resolved, f"{name} resolved in {client}", timeout=60)

    def answered() -> str | None:
        out = (kube.output(client, "nc", "-w", "2", "web", "80") or "").strip()
        return out if out in servers else None

    figures.answered.append(kube.wait(answered, f"web answering {client}", timeout=60))
    figures.first_ms = (time.perf_counter() - started) * 1000
    for _ in range(PROBES - 1):
        out = answered()
        if out is not None:
            figures.answered.append(out)
    return figures
