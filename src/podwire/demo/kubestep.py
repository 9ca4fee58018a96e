"""The Kubernetes step: pods made through kube-apiserver on both hosts, their IPs checked
against their Neutron ports, and each pinging a CNI-made pod on the other host."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from podwire.demo.kube import NAMESPACE, Kube
from podwire.demo.pods import Pod
from podwire.errors import StackError
from podwire.kube.manifests import toolbox_pod


@dataclass
class KubeFigures:
    skipped: str = ""
    ready_s: float = 0.0
    pods: int = 0
    running_s: float = 0.0
    matching: int = 0
    pings: int = 0

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"Kubernetes: skipped, {self.skipped}"]
        return [
            f"Kubernetes: 2 nodes (containerd + kubelet) Ready in {self.ready_s:.0f} s;"
            f" {self.pods} pods through kube-apiserver Running in {self.running_s:.1f} s",
            f"Kubernetes: podIPs = the fixed IPs of the Neutron port of their MAC, bound to"
            f" their node: {self.matching} of {self.pods}; pings to CNI pods on the other"
            f" host: {self.pings} of {self.pods}",
        ]


def run(
    kube: Kube, neutron: Any, hosts: tuple[str, ...], cni_pods: list[Pod], ready_s: float
) -> KubeFigures:
    """``ready_s``: how long the nodes took to be Ready."""
    names = [f"kube-pod-{i}" for i in range(1, 5)]
    placed = {name: hosts[i % len(hosts)] for i, name in enumerate(names)}
    started = time.perf_counter()
    kube.apply(*(toolbox_pod(name, NAMESPACE, host) for name, host in placed.items()))
    pods = kube.running(names)
    figures = KubeFigures("", ready_s, len(names), time.perf_counter() - started)
    print(kube.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide"), end="", flush=True)
    for name in names:
        port = _port_of(kube, neutron, name)
        ips = {ip["ip"] for ip in pods[name]["status"]["podIPs"]}
        figures.matching += (
            port is not None
            and port.binding_host_id == placed[name]
            and (ips == {ip["ip_address"] for ip in port.fixed_ips})
        )
        target = next(p for p in cni_pods if p.host != placed[name])
        figures.pings += kube.exec(name, "ping", "-c", "1", "-W", "2", target.ip)
    if figures.matching < figures.pods or figures.pings < figures.pods:
        raise StackError("Kubernetes pods: " + "; ".join(figures.lines()))
    return figures


def _port_of(kube: Kube, neutron: Any, pod: str) -> Any | None:
    """The Neutron port with the MAC of the pod's eth0 (pooled ports keep no pod's name)."""
    mac = (kube.output(pod, "cat", "/sys/class/net/eth0/address") or "").strip()
    ports = list(neutron.network.ports(mac_address=mac)) if mac else []
    return ports[0] if len(ports) == 1 else None
