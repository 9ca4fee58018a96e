"""kubelet for one simulated host: its configuration and the way it is started.

The settings follow this machine's facts (docs/kubernetes.md, "A Kubernetes node per simulated
host"): cgroup v1 without systemd (``failCgroupV1: false``, ``cgroupfs``, no QoS cgroups, no
node-allocatable enforcement), no swap check, and no eviction or image garbage collection
worth the name: several kubelets share one machine's disk and memory, and the images were
imported offline, so one collected could never be pulled again.

kubelet serves its API (exec, logs) with a cert of the stack's CA, trusts client certs of that
CA, and asks the apiserver whether a caller may do what it asks (``Webhook``): the apiserver's
own kubelet client identity is granted that by the stack.

It runs in the host's network namespace (its probes, streams and API connection are the
host's) and in a mount namespace of its own: kubelet puts its device-plugin socket at the
fixed path ``/var/lib/kubelet/device-plugins`` and its container log links in
``/var/log/containers`` whatever its root dir, so each node's own directories are bind-mounted
there, in that namespace only (two kubelets would otherwise share them, and links of pods
removed while kubelet is stopped would stay on the machine). The mount holding each path is
made private there first, so the binds never reach the machine even where ``/`` is shared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from podwire.files import atomic_write
from podwire.kube import node_pki

DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"
CONTAINER_LOGS_PATH = "/var/log/containers"
# Run by sh in kubelet's new mount namespace: pairs of (the node's dir, the fixed path), "--",
# then kubelet's command line.
MOUNT_NAMESPACE_SCRIPT = """set -e
while [ "$1" != "--" ]; do
    mkdir -p "$2"
    mount --make-private "$(findmnt -n -o TARGET -T "$2")"
    mount --bind "$1" "$2"
    shift 2
done
shift
exec "$@"
"""
KUBELET_PORT = 10250
HEALTHZ_PORT = 10248


@dataclass(frozen=True)
class KubeletFiles:
    """Where one node's kubelet keeps what it reads and writes."""

    node_dir: Path

    @property
    def root(self) -> Path:
        return self.node_dir / "kubelet"

    @property
    def device_plugins(self) -> Path:
        return self.root / "device-plugins"

    @property
    def container_logs(self) -> Path:
        return self.node_dir / "container-logs"

    @property
    def pki(self) -> Path:
        return self.node_dir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.node_dir / "kubelet.kubeconfig"

    @property
    def config(self) -> Path:
        return self.node_dir / "kubelet-config.json"

    @property
    def pod_logs(self) -> Path:
        return self.node_dir / "pod-logs"

    @property
    def log(self) -> Path:
        return self.node_dir / "logs" / "kubelet.log"


def configuration(
    files: KubeletFiles,
    runtime_socket: str,
    node_ip: str,
    client_ca: Path,
    cluster_dns: str | None = None,
) -> dict[str, object]:
    """The KubeletConfiguration (kubelet.config.k8s.io/v1beta1) of one node; ``cluster_dns``:
    the pods' resolver (the stack's kube-dns Service), else the node's own resolv.conf."""
    serving = node_pki.serving_pair(files.pki)
    endpoint = f"unix://{runtime_socket}"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "address": node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": HEALTHZ_PORT,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "rotateCertificates": False,
        "podLogsDir": str(files.pod_logs),
        "clusterDomain": "cluster.local",
        **({"clusterDNS": [cluster_dns]} if cluster_dns else {}),
        "resolvConf": "/etc/resolv.conf",
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
    }


def write_configuration(files: KubeletFiles, body: dict[str, object]) -> None:
    atomic_write(files.config, (json.dumps(body, indent=2) + "\n").encode(), 0o644)


def argv(kubelet: Path, files: KubeletFiles, host: str, node_ip: str, netns: str) -> list[str]:
    """kubelet in the host's network namespace and a mount namespace of its own."""
    return [
        *("unshare", "-m", "--propagation", "unchanged", "--"),
        *("nsenter", f"--net=/run/netns/{netns}", "--"),
        *("sh", "-c", MOUNT_NAMESPACE_SCRIPT, "kube-node"),
        *(str(files.device_plugins), DEVICE_PLUGIN_PATH),
        *(str(files.container_logs), CONTAINER_LOGS_PATH, "--"),
        str(kubelet),
        f"--config={files.config}",
        f"--kubeconfig={files.kubeconfig}",
        f"--root-dir={files.root}",
        f"--hostname-override={host}",
        f"--node-ip={node_ip}",
    ]
