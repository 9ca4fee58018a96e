"""The Kubernetes step: pods made through kube-apiserver on both hosts, their IPs and their
``podwire.io/port-id`` annotations checked against their Neutron ports, each pinging a
CNI-made pod on the other host; then NetworkPolicy between two of them (``netpolstep``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from podwire.demo import netpolstep
from podwire.demo.kube import NAMESPACE, Kube
from podwire.demo.pods import Pod
from podwire.errors import StackError
from podwire.kube.manifests import toolbox_pod

PORT_ID = "podwire.io/port-id"


@dataclass
class KubeFigures:
    skipped: str = ""
    ready_s: float = 0.0
    pods: int = 0
    running_s: float = 0.0
    matching: int = 0
    annotated: int = 0
    pings: int = 0
    policy: netpolstep.PolicyFigures | None = None

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"Kubernetes: skipped, {self.skipped}"]
        return [
            f"Kubernetes: 2 nodes (containerd + kubelet) Ready in {self.ready_s:.0f} s;"
            f" {self.pods} pods through kube-apiserver Running in {self.running_s:.1f} s",
            f"Kubernetes: podIPs = the fixed IPs of the Neutron port of their MAC, bound to"
            f" their node: {self.matching} of {self.pods}; pings to CNI pods on the other"
            f" host: {self.pings} of {self.pods}",
            f"Kubernetes: the {PORT_ID} annotation names that port: {self.annotated} of"
            f" {self.pods}",
            *([self.policy.line()] if self.policy else []),
        ]


def run(
    kube: Kube, neutron: Any, hosts: tuple[str, ...], cni_pods: list[Pod], ready_s: float
) -> KubeFigures:
    """``ready_s``: how long the nodes took to be Ready."""
    names = [f"kube-pod-{i}" for i in range(1, 5)]
    placed = {name: hosts[i % len(hosts)] for i, name in enumerate(names)}
    started = time.perf_counter()
    kube.apply(
        *(netpolstep.labelled(toolbox_pod(n, NAMESPACE, host)) for n, host in placed.items())
    )
    pods = kube.running(names)
    figures = KubeFigures("", ready_s, len(names), time.perf_counter() - started)
    print(kube.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide"), end="", flush=True)
    ports = _check(kube, neutron, figures, pods, placed, cni_pods)
    server, client = names[0], names[1]  # on different hosts
    pair = netpolstep.Pair(client, server, pods[server]["status"]["podIP"])
    figures.policy = netpolstep.run(kube, neutron, pair, ports[server].id)
    return figures


def _check(
    kube: Kube,
    neutron: Any,
    figures: KubeFigures,
    pods: dict[str, dict[str, Any]],
    placed: dict[str, str],
    cni_pods: list[Pod],
) -> dict[str, Any]:
    """Each pod's Neutron port (by MAC) against what the API says of the pod; raises
    unless all agree and every pod reaches a CNI pod on the other host."""
    ports = {name: _port_of(kube, neutron, name) for name in placed}
    annotations = _annotated(kube, list(placed))
    for name, port in ports.items():
        figures.annotated += port is not None and annotations[name] == port.id
        ips = {ip["ip"] for ip in pods[name]["status"]["podIPs"]}
        figures.matching += (
            port is not None
            and port.binding_host_id == placed[name]
            and (ips == {ip["ip_address"] for ip in port.fixed_ips})
        )
        target = next(p for p in cni_pods if p.host != placed[name])
        figures.pings += kube.exec(name, "ping", "-c", "1", "-W", "2", target.ip)
    if min(figures.matching, figures.annotated, figures.pings) < figures.pods:
        raise StackError("Kubernetes pods: " + "; ".join(figures.lines()))
    return ports


def _annotated(kube: Kube, names: list[str]) -> dict[str, str]:
    """Each pod's port-id annotation, once the controller has written all of them."""

    def written() -> dict[str, str] | None:
        found = {name: a.get(PORT_ID, "") for name, a in kube.annotations().items()}
        return found if all(found.get(name) for name in names) else None

    return kube.wait(written, f"the {PORT_ID} annotations of {', '.join(names)}")


def _port_of(kube: Kube, neutron: Any, pod: str) -> Any | None:
    """The Neutron port with the MAC of the pod's eth0 (pooled ports keep no pod's name)."""
    mac = (kube.output(pod, "cat", "/sys/class/net/eth0/address") or "").strip()
    ports = list(neutron.network.ports(mac_address=mac)) if mac else []
    return ports[0] if len(ports) == 1 else None
