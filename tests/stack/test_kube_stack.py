"""`podwire stack up --kubernetes`: the real kube-apiserver on the stack's etcd, with
kube-controller-manager and kube-scheduler, as a user and the components see it: TLS with the
stack's CA, RBAC that refuses who may not, controllers that finalize, a scheduler that runs,
and nothing left behind by `stack down` or a crash."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from podwire.stack import kube_control, procs
from tests.conftest import PODWIRE, start_stack
from tests.stack.conftest import kubectl

pytestmark = [pytest.mark.stack, pytest.mark.slow]

KUBE_GO_MOD = Path(__file__).resolve().parents[2] / "kube" / "go.mod"


def pinned_version() -> str:
    found = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", KUBE_GO_MOD.read_text(), re.MULTILINE)
    assert found, "no k8s.io/kubernetes in kube/go.mod"
    return found.group(1)


def eventually(check: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return check()


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_apiserver_is_ready_on_a_non_loopback_address(kube_stack: dict[str, Any]) -> None:
    url = urlsplit(kube_stack["kube_apiserver"])
    assert url.scheme == "https"
    assert not ipaddress.ip_address(url.hostname or "").is_loopback
    assert Path(kube_stack["kubeconfig"]).is_file()
    assert ok(kubectl(kube_stack, "get", "--raw", "/readyz")) == "ok"
    names = ok(kubectl(kube_stack, "get", "namespaces", "-o", "name")).split()
    assert {"namespace/default", "namespace/kube-system"} <= set(names)


def test_the_binaries_report_the_pinned_release(kube_stack: dict[str, Any]) -> None:
    versions = json.loads(ok(kubectl(kube_stack, "version", "-o", "json")))
    assert versions["clientVersion"]["gitVersion"] == pinned_version()
    assert versions["serverVersion"]["gitVersion"] == pinned_version()


def test_kubernetes_keys_stay_under_their_prefix(kube_stack: dict[str, Any]) -> None:
    etcdctl = ["--endpoints", kube_stack["etcd"], "get", "--prefix", "--keys-only"]
    found = _etcd_keys(etcdctl, f"{kube_control.ETCD_PREFIX}/namespaces/")
    assert f"{kube_control.ETCD_PREFIX}/namespaces/default" in found
    assert not _etcd_keys(etcdctl, "/registry/")


def _etcd_keys(argv: list[str], prefix: str) -> list[str]:
    from podwire.stack.etcd_server import etcd_binary

    etcdctl = Path(etcd_binary()).with_name("etcdctl")
    if not etcdctl.exists():
        pytest.skip("no etcdctl beside the etcd server")
    done = subprocess.run([str(etcdctl), *argv, prefix], capture_output=True, text=True)
    return [line for line in ok(done).splitlines() if line]


def test_a_deleted_namespace_is_finalized_by_the_controller_manager(
    kube_stack: dict[str, Any],
) -> None:
    ok(kubectl(kube_stack, "create", "namespace", "pw-finalize"))
    # The service account controller (as its own service account) makes `default`.
    assert eventually(
        lambda: kubectl(kube_stack, "-n", "pw-finalize", "get", "sa", "default").returncode == 0
    )
    ok(kubectl(kube_stack, "-n", "pw-finalize", "create", "configmap", "c", "--from-literal=a=b"))
    ok(kubectl(kube_stack, "delete", "namespace", "pw-finalize", "--wait=false"))

    def gone() -> bool:
        done = kubectl(kube_stack, "get", "namespace", "pw-finalize")
        return done.returncode != 0 and "NotFound" in done.stderr

    assert eventually(gone), kubectl(kube_stack, "get", "ns", "pw-finalize", "-o", "yaml").stdout


def test_the_scheduler_runs(kube_stack: dict[str, Any]) -> None:
    """No node exists yet: the scheduler's verdict on a pod is that it is unschedulable."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pw-unschedulable", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "localhost/none:latest"}]},
    }
    applied = subprocess.run(
        [str(Path(kube_stack["kube_bin_dir"]) / "kubectl"), "--kubeconfig",
         kube_stack["kubeconfig"], "apply", "-f", "-"],
        input=json.dumps(pod), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    ok(applied)
    try:

        def judged() -> bool:
            out = kubectl(kube_stack, "get", "pod", "pw-unschedulable", "-o", "json").stdout
            conditions = json.loads(out or "{}").get("status", {}).get("conditions", [])
            return any(c.get("reason") == "Unschedulable" for c in conditions)

        assert eventually(judged)
    finally:
        kubectl(kube_stack, "delete", "pod", "pw-unschedulable", "--grace-period=0", "--force")


def test_rbac_refuses_the_scheduler_what_it_may_not_do(
    kube_stack: dict[str, Any],
) -> None:
    scheduler = str(Path(kube_stack["kubeconfig"]).with_name("kube-scheduler.kubeconfig"))
    done = kubectl(kube_stack, "create", "namespace", "pw-forbidden", kubeconfig=scheduler)
    assert done.returncode != 0
    assert "forbidden" in done.stderr and "system:kube-scheduler" in done.stderr
    # ... and lets it do its job.
    ok(kubectl(kube_stack, "get", "pods", "-A", kubeconfig=scheduler))


def test_an_anonymous_client_is_refused(kube_stack: dict[str, Any]) -> None:
    ca = Path(kube_stack["kubeconfig"]).parent / "pki" / "ca.crt"
    context = ssl.create_default_context(cafile=str(ca))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(
            f"{kube_stack['kube_apiserver']}/api/v1/namespaces", timeout=10, context=context
        )
    assert refused.value.code in (401, 403)


def test_the_apiserver_may_call_kubelets(kube_stack: dict[str, Any]) -> None:
    user = "kube-apiserver-kubelet-client"
    for resource in ("nodes/proxy", "nodes/log"):
        answer = kubectl(kube_stack, "auth", "can-i", "get", resource, "--as", user)
        assert answer.stdout.strip() == "yes", answer.stderr
    assert (
        kubectl(kube_stack, "auth", "can-i", "delete", "pods", "--as", user).stdout.strip() == "no"
    )


def test_each_component_logs_under_the_logs_dir(kube_stack: dict[str, Any]) -> None:
    logs = Path(kube_stack["data_dir"]) / "logs"
    for name in kube_control.COMPONENTS:
        assert kube_stack["pids"][name] > 0
        assert (logs / f"{name}.out").stat().st_size > 0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODWIRE, *args], capture_output=True, text=True, timeout=120)


def wait_gone(pids: list[int], timeout: float = 60) -> bool:
    return eventually(lambda: not any(procs.running(pid) for pid in pids), timeout)


def test_down_restart_and_crash_leave_nothing_behind(work_dir: Path) -> None:
    kube_control.check_binaries(kube_control.default_bin_dir())
    data_dir = work_dir / "kube-lifecycle"
    proc, info = start_stack(data_dir, extra=("--kubernetes",))
    ca = (data_dir / "kube" / "pki" / "ca.crt").read_bytes()
    try:
        ok(kubectl(info, "create", "namespace", "pw-kept"))
    finally:
        assert cli("stack", "down", "--data-dir", str(data_dir)).returncode == 0
    assert proc.wait(timeout=60) == 0
    assert wait_gone([pid for name, pid in info["pids"].items() if name != "supervisor"])
    assert not procs.pids_marked(str(data_dir))

    proc, again = start_stack(data_dir, extra=("--kubernetes",))
    try:
        assert (data_dir / "kube" / "pki" / "ca.crt").read_bytes() == ca
        assert again["kube_apiserver"] == info["kube_apiserver"]  # its port kept
        ok(kubectl(again, "get", "namespace", "pw-kept"))  # etcd kept it
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # a crash: the components must not outlive it
    proc.wait()
    assert wait_gone([pid for name, pid in again["pids"].items() if name != "supervisor"])
    assert cli("stack", "down", "--data-dir", str(data_dir)).returncode == 0
    assert not procs.pids_marked(str(data_dir))


def _a_records(server: tuple[str, int], name: str) -> list[str]:
    """The IPv4 answers of one A query over UDP (a minimal client: no library needed)."""
    query = struct.pack("!HHHHHH", 0x5057, 0x0100, 1, 0, 0, 0)
    query += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    query += struct.pack("!HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.sendto(query, server)
        reply = sock.recv(4096)
    answers = struct.unpack("!H", reply[6:8])[0]
    offset = len(query)
    found = []
    for _ in range(answers):
        offset = _past_name(reply, offset)
        kind, _, _, length = struct.unpack("!HHIH", reply[offset : offset + 10])
        offset += 10
        if kind == 1:
            found.append(socket.inet_ntoa(reply[offset : offset + length]))
        offset += length
    return found


def _past_name(reply: bytes, offset: int) -> int:
    """The offset after the name at ``offset``: labels up to the root, or a pointer."""
    while reply[offset]:
        if reply[offset] >= 0xC0:
            return offset + 2
        offset += 1 + reply[offset]
    return offset + 1


def test_coredns_serves_the_cluster_zone_behind_kube_dns(kube_stack: dict[str, Any]) -> None:
    if "cluster_dns" not in kube_stack:
        pytest.skip("the stack runs without CoreDNS: scripts/setup builds it")
    port = kube_stack["ports"]["coredns"]
    address = urlsplit(kube_stack["kube_apiserver"]).hostname or ""
    name = "kubernetes.default.svc.cluster.local"
    found: list[list[str]] = [[]]

    def answered() -> bool:  # UDP: a lost datagram is asked again
        try:
            found[0] = _a_records((address, port), name)
        except TimeoutError:
            return False
        return bool(found[0])

    assert eventually(answered, 30), f"no answer from CoreDNS at {address}:{port}"
    assert found[0] == [kube_control.service_ip()]
    service = json.loads(ok(kubectl(kube_stack, "get", "svc", "-n", "kube-system", "kube-dns",
                                    "-o", "json")))  # fmt: skip
    assert service["spec"]["clusterIP"] == kube_stack["cluster_dns"]
    piece = json.loads(ok(kubectl(kube_stack, "get", "endpointslice", "-n", "kube-system",
                                  "kube-dns-stack", "-o", "json")))  # fmt: skip
    assert piece["endpoints"][0]["addresses"] == [address]
    assert {p["port"] for p in piece["ports"]} == {port}
