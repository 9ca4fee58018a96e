"""Pods through the Kubernetes API to Running, on one real kubelet: podwire vs bridge+host-local.

Needs bench.run's stack with ``--kubernetes`` (bench.run adds it when this section runs). One
simulated host gets podwire's controller (its pool for this node pre-populated with 32 ports
in one security group) and agent, as in cri_bench, and ``podwire kube-node`` (a private
containerd and a real kubelet, registered as a Node). Both conflists are swapped in turn into
that containerd's CNI conf dir (containerd reloads it), so the same kubelet and containerd
serve both, alternating by round (and swapping which goes first) so this VM's drift hits both
alike. Before each round the pool is back to a burst's worth of ready ports and settled (as in
cri_bench), and every sandbox of the previous round is stopped (its CNI DEL done).

A pod is created with ``kubectl apply`` (nodeName set: no scheduler) and timed until its phase
is Running (``kubectl wait``, a watch) and, for podwire, its Neutron port is ACTIVE.
Rows: one pod at a time; 30 pods in one ``kubectl apply`` until all Running (wall). Then the
same again with the controller restarted with ``[kubernetes]`` and 20 NetworkPolicies
selecting the pods (``kube_policies``), against reference rounds of that half.

Then the agent's memif device plugin (configured for that kubelet) and the real kubelet:
kubelet is killed (kube-node starts it again) and the time from its new registration socket
(``device-plugins/kubelet.sock``, polled every 2 ms) to the plugin's next registration (the
agent's ``podwire_deviceplugin_registrations_total``, polled every 5 ms) is recorded; the
kubelet's own way back (kill -> that socket) beside it. 11 s between kills: kube-node's
restart pause starts again from 0.5 s only once kubelet ran 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from bench.cri_bench import BURST, PodwireNode, _reference
from bench.harness import wait_for
from bench.kube_policies import LABEL, POLICIES, enforce, policies
from bench.stats import row
from podwire.cni.install import conflist
from podwire.demo.cnf import settings_toml
from podwire.errors import StackError
from podwire.kube.containerd import Containerd
from podwire.kube.images import TOOLBOX_IMAGE
from podwire.kube.node import node_dir
from podwire.stack import procs
from podwire.stack.netutil import free_port
from tests.agent.netenv import NetEnv
from tests.cri.cri import Cri, write_conflist

BURST_ROUNDS = 3
SINGLES_MAX = 40
RESTARTS_MAX = 10
RESTART_CALM = 11.0  # kube-node's pause before a kubelet restart is back at 0.5 s after 10 s
REGISTRATIONS = "podwire_deviceplugin_registrations_total "


class Kube:
    """kubectl as the stack's admin, in one namespace of this bench."""

    def __init__(self, stack: dict[str, Any], namespace: str) -> None:
        self.binary = str(Path(stack["kube_bin_dir"]) / "kubectl")
        self.kubeconfig = stack["kubeconfig"]
        self.namespace = namespace

    def run(self, *args: str, stdin: str = "", check: bool = True) -> str:
        done = subprocess.run(
            [self.binary, "--kubeconfig", self.kubeconfig, "--request-timeout=60s", *args],
            input=stdin.encode(),
            capture_output=True,
            timeout=300,
            check=False,
        )
        if check and done.returncode != 0:
            raise StackError(f"kubectl {' '.join(args)}: {done.stderr.decode().strip()}")
        return done.stdout.decode()

    def create_namespace(self) -> None:
        self.run("create", "namespace", self.namespace)
        account = ("get", "serviceaccount", "-n", self.namespace, "default", "--ignore-not-found")
        wait_for(lambda: self.run(*account).strip(), 60, 0.2, f"{self.namespace}'s ServiceAccount")

    def apply(self, objects: list[dict[str, Any]]) -> None:
        body = {"apiVersion": "v1", "kind": "List", "items": objects}
        self.run("apply", "-f", "-", stdin=json.dumps(body))

    def wait_running(self, selector: str) -> None:
        self.run(
            *("wait", "-n", self.namespace, "pod", "-l", selector, "--timeout=180s"),
            "--for=jsonpath={.status.phase}=Running",
        )

    def pod_ips(self, selector: str) -> list[str]:
        listed = json.loads(
            self.run("get", "pods", "-n", self.namespace, "-l", selector, "-o", "json")
        )
        return [pod["status"]["podIP"] for pod in listed["items"]]

    def delete(self, selector: str) -> None:
        self.run("delete", "pods", "-n", self.namespace, "-l", selector, "--wait=true")


def _pod(namespace: str, name: str, node: str, tag: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"round": tag, **LABEL}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "toolbox",
                    "image": TOOLBOX_IMAGE,
                    "imagePullPolicy": "Never",  # imported offline: no image pull is timed
                    "command": ["sleep", "3600"],
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


async def _ready(cri: Cri, sandbox: str) -> bool:
    try:
        return await cri.ready(sandbox)
    except grpc.aio.AioRpcError as exc:  # kubelet removed it since the listing
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise


class Bench:
    def __init__(self, kube: Kube, node: PodwireNode, containerd: Containerd, host: str) -> None:
        self.kube, self.node, self.containerd, self.host = kube, node, containerd, host
        self.ours_body = conflist(node.spec(containerd))
        self.ref_body = _reference(containerd.work)
        self.samples: dict[str, dict[str, list[float]]] = {
            name: {"single": [], "burst": []} for name in ("pw", "ref", "np", "np-ref")
        }
        self.late = 0  # rounds of podwire whose ports were not all ACTIVE once Running

    def _all_active(self, ips: list[str], deadline: float) -> bool:
        """Until every pod's Neutron port (found by its address) is ACTIVE; whether they all
        were at the first look."""
        wanted, first = set(ips), True
        while True:
            ports = self.node.conn.network.ports(project_id=self.node.project)
            active = {
                ip["ip_address"]
                for port in ports
                if port.status == "ACTIVE"
                for ip in port.fixed_ips
            }
            if wanted <= active:
                return first
            if time.monotonic() > deadline:
                raise StackError(f"ports of {sorted(wanted - active)} not ACTIVE")
            first = False
            time.sleep(0.05)

    def _start(self, name: str, count: int, tag: str) -> float:
        """Create ``count`` pods; ms until all are Running. For podwire the ports are checked
        after that: a port not yet ACTIVE at the first look stops the clock when it is seen
        ACTIVE instead (pooled ports are ACTIVE before a pod gets one)."""
        pods = [_pod(self.kube.namespace, f"{tag}-{i}", self.host, tag) for i in range(count)]
        selector = f"round={tag}"
        started = time.monotonic()
        self.kube.apply(pods)
        self.kube.wait_running(selector)
        took = (time.monotonic() - started) * 1000
        if name in ("pw", "np") and not self._all_active(
            self.kube.pod_ips(selector), time.monotonic() + 60
        ):
            self.late += 1
            took = (time.monotonic() - started) * 1000
        return took

    async def _sandboxes_stopped(self, cri: Cri) -> None:
        deadline = time.monotonic() + 120
        while any([await _ready(cri, s) for s in await cri.sandboxes()]):
            if time.monotonic() > deadline:
                raise StackError("pod sandboxes still ready 120 s after their pods' deletion")
            await asyncio.sleep(0.1)

    async def _switch(self, cri: Cri, body: dict[str, Any]) -> None:
        await self._sandboxes_stopped(cri)  # every DEL through the conflist that made it
        write_conflist(self.containerd.conf_dir, body)
        await cri.wait_loaded(body)
        await asyncio.to_thread(self.node.settle)

    def _body(self, name: str) -> dict[str, Any]:
        return self.ours_body if name in ("pw", "np") else self.ref_body

    async def _round(
        self, cri: Cri, name: str, singles: int, burst: bool, tag: str, keep: bool = True
    ) -> None:
        await self._switch(cri, self._body(name))
        for i in range(singles):
            took = await asyncio.to_thread(self._start, name, 1, f"{tag}-s{i}")
            if keep:
                self.samples[name]["single"].append(took)
            await asyncio.to_thread(self.kube.delete, f"round={tag}-s{i}")
        if burst:
            await self._switch(cri, self._body(name))
            took = await asyncio.to_thread(self._start, name, BURST, f"{tag}-b")
            self.samples[name]["burst"].append(took)
            await asyncio.to_thread(self.kube.delete, f"round={tag}-b")

    async def measure(self, singles: int, ours: str = "pw", ref: str = "ref") -> None:
        """Rounds of ``ours`` (podwire's conflist) and ``ref`` (the reference's), alternating;
        the samples are kept under those names."""
        cri = Cri(self.containerd.socket)
        try:
            for name in (ours, ref):  # warm-ups, not recorded
                await self._round(cri, name, 1, False, f"{name}-warm", keep=False)
            rounds = max(BURST_ROUNDS, 1)
            per_round = [singles // rounds + (i < singles % rounds) for i in range(rounds)]
            for index, count in enumerate(per_round):
                order = (ours, ref) if index % 2 == 0 else (ref, ours)  # no order bias
                for name in order:
                    await self._round(cri, name, count, True, f"{name}{index}")
            await self._sandboxes_stopped(cri)
        finally:
            await cri.close()

    def rows(self) -> list[dict[str, Any]]:
        print(f"kube_bench: podwire ports not ACTIVE once Running: {self.late}", file=sys.stderr)
        ours, ref = self.samples["pw"], self.samples["ref"]
        reference = "bridge+host-local, same kubelet+containerd"
        return [
            row(
                "k8s pod apply -> Running, port ACTIVE (one at a time, pooled port, SGs)",
                ours["single"],
                reference,
                ref["single"],
            ),
            row("k8s pod apply -> Running, the reference alone (its p99)", ref["single"]),
            row(
                f"k8s {BURST} pods in one apply -> all Running, ports ACTIVE (wall)",
                ours["burst"],
                reference,
                ref["burst"],
            ),
            row(f"k8s {BURST} pods in one apply -> all Running, the reference alone", ref["burst"]),
        ]

    def policy_rows(self) -> list[dict[str, Any]]:
        """The second half's: the controller with ``[kubernetes]``, the policies in force,
        against the reference's rounds of that half."""
        ours, ref = self.samples["np"], self.samples["np-ref"]
        reference = "bridge+host-local, same kubelet+containerd, same half"
        where = f"{POLICIES} NetworkPolicies selecting the pod"
        return [
            row(f"k8s pod apply -> Running, port ACTIVE, {where}", ours["single"], reference,
                ref["single"]),
            row(f"k8s pod apply -> Running, the reference alone ({where}'s half)", ref["single"]),
            row(f"k8s {BURST} pods in one apply -> all Running, ports ACTIVE, {where}",
                ours["burst"], reference, ref["burst"]),
        ]  # fmt: skip


def _registrations(metrics: str) -> float:
    with urllib.request.urlopen(metrics, timeout=5) as response:
        lines = response.read().decode().splitlines()
    return sum(float(line.split()[1]) for line in lines if line.startswith(REGISTRATIONS))


def _identity(path: Path) -> tuple[int, int] | None:
    """A file's inode and change time: a socket made again may reuse the old one's inode."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_ctime_ns


def _restart_once(config: str, socket: Path, metrics: str) -> tuple[float, float]:
    """ms from the kill to kubelet's new socket, and from that socket to the registration."""
    before, old = _registrations(metrics), _identity(socket)
    (pid,) = procs.pids_marked(config)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _identity(socket) not in (None, old), 60, 0.002, "kubelet's new socket")
    up = time.monotonic()
    wait_for(lambda: _registrations(metrics) > before, 60, 0.005, "registered again")
    return (up - killed) * 1000, (time.monotonic() - up) * 1000


def reregistrations(top: Path, metrics: str, count: int) -> list[dict[str, Any]]:
    """Kill the node's kubelet ``count`` times: its way back, and the plugin's after it."""
    config = str(top / "kubelet-config.json")
    socket = top / "kubelet" / "device-plugins" / "kubelet.sock"
    wait_for(lambda: _registrations(metrics) >= 1, 60, 0.1, "the device plugin registered")
    restarts = []
    for _ in range(count):
        time.sleep(RESTART_CALM)
        restarts.append(_restart_once(config, socket, metrics))
    back, registered = [kubelet for kubelet, _ in restarts], [plugin for _, plugin in restarts]
    return [
        row("deviceplugin registered again, real kubelet (its new kubelet.sock -> registered)",
            registered),
        row("kubelet killed -> kube-node's new kubelet listening (kubelet.sock)", back),
    ]  # fmt: skip


@contextlib.contextmanager
def _kube_node(stack: dict[str, Any], node: PodwireNode, log: Path) -> Iterator[Any]:
    argv = [
        *(sys.executable, "-m", "podwire.cli.main", "kube-node"),
        *("--data-dir", stack["data_dir"], "--host", node.host, "--netns", node.host_ns),
        *("--agent-socket", node.socket, "--network", node.network.id),
        *("--project", node.project, "--log-level", "INFO"),
    ]
    with log.open("ab") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            raise StackError(f"kube-node exited {proc.returncode}: see {log}")
        yield json.loads(line)
    finally:
        procs.stop_child(proc, timeout=180)


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    if "kubeconfig" not in stack:
        raise StackError("kube_bench needs the stack with --kubernetes (bench.run adds it)")
    netenv = NetEnv()
    work = Path(stack["data_dir"]) / f"kube-bench-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    kube = Kube(stack, f"pwb-{uuid.uuid4().hex[:8]}")
    try:
        host_ns, vtep = netenv.host(random.randrange(0, 236, 8) + 1)
        host = f"{netenv.tag}-h1"
        node = PodwireNode(stack, work, host, host_ns)
        top = node_dir(Path(stack["data_dir"]).resolve(), host)
        try:
            # The agent's VTEP: the host's underlay address (kube-node routes to the apiserver
            # from it); its memif device plugin serves that kubelet.
            ops = f"127.0.0.1:{free_port()}"
            plugin = settings_toml(top / "kubelet", node.services.work)
            node.start(vtep, f'ops_listen = "{ops}"\n{plugin}')
            metrics = f"http://{ops}/metrics"
            kube.create_namespace()
            with _kube_node(stack, node, work / "kube-node.log"):
                containerd = Containerd(top / "containerd", netns=host_ns)
                bench = Bench(kube, node, containerd, host)
                singles = max(1, min(samples, SINGLES_MAX))
                asyncio.run(bench.measure(singles))
                restarts = reregistrations(top, metrics, max(1, min(samples, RESTARTS_MAX)))
                kube.apply(policies(kube.namespace))
                enforce(stack, node, kube.namespace)
                asyncio.run(bench.measure(singles, "np", "np-ref"))
                return bench.rows() + bench.policy_rows() + restarts
        finally:
            kube.run("delete", "namespace", kube.namespace, "--wait=false", check=False)
            kube.run("delete", "node", host, "--ignore-not-found", check=False)
            node.close(stack)
    finally:
        netenv.cleanup()
        shutil.rmtree(work, ignore_errors=True)  # the agent's socket and the services' logs
