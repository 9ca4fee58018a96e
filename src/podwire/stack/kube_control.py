"""The local stack's Kubernetes control plane (``podwire stack up --kubernetes``): where its
files live, the address it is reached at, and the command lines of kube-apiserver,
kube-controller-manager and kube-scheduler.

The apiserver listens on every address of the machine's namespace and advertises the source
address of the default route: simulated hosts are network namespaces, which cannot reach this
namespace's loopback, while a namespace routed to the machine reaches any of its addresses.
The controller manager and the scheduler only serve their health checks, on loopback.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import StackError
from podwire.files import atomic_write
from podwire.stack import kube_pki, kubeconfig

APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
COMPONENTS = (APISERVER, CONTROLLER_MANAGER, SCHEDULER)
BINARIES = (*COMPONENTS, "kubectl", "kubelet")
# Kubernetes' keys in the stack's etcd, beside podwire's own.
ETCD_PREFIX = "/kubernetes"
# Service IPs (no kube-proxy runs: only the apiserver's own `kubernetes` Service uses one).
SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
SERVICE_ACCOUNT_ISSUER = f"https://kubernetes.default.svc.{CLUSTER_DOMAIN}"
# An address outside any network a test uses: only the route to it is looked up, nothing sent.
ROUTE_PROBE = "198.51.100.1"


def default_bin_dir() -> Path:
    """Where scripts/setup links the binaries it builds once per machine."""
    return Path(sys.prefix) / "share" / "podwire-kube"


def check_binaries(bin_dir: Path) -> None:
    missing = [name for name in BINARIES if not (bin_dir / name).is_file()]
    if missing:
        raise StackError(
            f"the Kubernetes binaries are not in {bin_dir} (missing: {', '.join(missing)}):"
            " run scripts/setup, which builds them once per machine (docs/development.md)"
        )


def advertise_address() -> str:
    """The machine's address towards its default route: not loopback, so the `kubernetes`
    Service's endpoint is valid and a network namespace routed here can reach it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((ROUTE_PROBE, 9))
        except OSError as exc:
            raise StackError(
                "--kubernetes: no IPv4 default route to advertise the apiserver on;"
                " give an address with --kube-address"
            ) from exc
        address = str(probe.getsockname()[0])
    if ipaddress.ip_address(address).is_loopback:
        raise StackError(f"--kubernetes: the default route's address {address} is loopback")
    return address


def service_ip() -> str:
    """The `kubernetes` Service's cluster IP: the range's first address."""
    return str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))


def server_hosts(address: str) -> list[str]:
    """Every name a client may use for the apiserver, for its serving cert."""
    service = f"kubernetes.default.svc.{CLUSTER_DOMAIN}"
    dns = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", service, "localhost"]
    return [address, "127.0.0.1", service_ip(), *dns]


@dataclass(frozen=True)
class ControlPlane:
    """One stack's control plane: its files under ``DIR/kube`` and its ports."""

    data_dir: Path
    bin_dir: Path
    address: str  # advertised, and in the serving cert
    apiserver_port: int
    controller_manager_port: int
    scheduler_port: int
    etcd_urls: tuple[str, ...]

    @property
    def root(self) -> Path:
        return self.data_dir / "kube"

    @property
    def pki(self) -> kube_pki.Pki:
        return kube_pki.Pki(self.root / "pki")

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.apiserver_port}"

    def kubeconfig(self, name: str) -> Path:
        return self.root / f"{name}.kubeconfig"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig("admin")

    def prepare(self) -> None:
        """The PKI, a kubeconfig per client identity, and the scheduler's config file."""
        self.pki.ensure(server_hosts(self.address))
        for name, identity in kube_pki.CLIENTS.items():
            if name != "apiserver-kubelet-client":
                pair = self.pki.pair(name)
                kubeconfig.write(
                    self.kubeconfig(name), self.url, self.pki.ca.cert, pair, identity.name
                )
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig(SCHEDULER))},
            "leaderElection": {"leaderElect": False},
        }
        atomic_write(self.root / "kube-scheduler.json", json.dumps(config).encode(), 0o644)

    def apiserver_argv(self) -> list[str]:
        pki = self.pki
        kubelet_client = pki.pair("apiserver-kubelet-client")
        return [
            str(self.bin_dir / APISERVER),
            f"--etcd-servers={','.join(self.etcd_urls)}",
            f"--etcd-prefix={ETCD_PREFIX}",
            # The compactor would compact the whole keyspace, podwire's watchers' history too.
            "--etcd-compaction-interval=0",
            "--bind-address=0.0.0.0",
            f"--secure-port={self.apiserver_port}",
            f"--advertise-address={self.address}",
            f"--tls-cert-file={pki.apiserver.cert}",
            f"--tls-private-key-file={pki.apiserver.key}",
            f"--client-ca-file={pki.ca.cert}",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            "--kubelet-preferred-address-types=InternalIP",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_accounts.cert}",
            f"--service-account-signing-key-file={pki.service_accounts.key}",
        ]

    def controller_manager_argv(self) -> list[str]:
        pki = self.pki
        own = self.kubeconfig(CONTROLLER_MANAGER)
        return [
            str(self.bin_dir / CONTROLLER_MANAGER),
            f"--kubeconfig={own}",
            f"--authentication-kubeconfig={own}",
            f"--authorization-kubeconfig={own}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.controller_manager_port}",
            "--leader-elect=false",  # the only one: no lease to wait for after a restart
            "--use-service-account-credentials",
            # No cloud, and Neutron assigns pod addresses: no node CIDRs to allocate.
            "--controllers=*,-nodeipam,-cloud-node-lifecycle",
            f"--root-ca-file={pki.ca.cert}",
            f"--service-account-private-key-file={pki.service_accounts.key}",
            f"--cluster-signing-cert-file={pki.ca.cert}",
            f"--cluster-signing-key-file={pki.ca.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
        ]

    def scheduler_argv(self) -> list[str]:
        own = self.kubeconfig(SCHEDULER)
        return [
            str(self.bin_dir / SCHEDULER),
            f"--config={self.root / 'kube-scheduler.json'}",
            f"--authentication-kubeconfig={own}",
            f"--authorization-kubeconfig={own}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.scheduler_port}",
        ]
