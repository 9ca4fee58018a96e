"""The demo's Kubernetes: ``podwire kube-node`` (containerd + kubelet) on each simulated host,
registered with the stack's kube-apiserver, and kubectl as the stack's admin.

The nodes start together (each builds and imports its images, then waits for its Node to be
Ready) and announce themselves with one JSON line; they stop on SIGTERM, leaving nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from podwire.errors import StackError
from podwire.kube.node import node_dir
from podwire.stack import kube_control, procs

NAMESPACE = "podwire-demo"
T = TypeVar("T")


def missing() -> str:
    """Why the Kubernetes steps cannot run here, or "" when they can."""
    try:
        kube_control.check_binaries(kube_control.default_bin_dir())
    except StackError as exc:
        return f"the Kubernetes binaries are not built ({exc}; scripts/setup builds them)"
    return ""


def kubelet_root(stack_dir: str, host: str) -> Path:
    """Where kube-node puts ``host``'s kubelet: known before it starts, for the agent."""
    return node_dir(Path(stack_dir), host) / "kubelet"


@dataclass
class Kube:
    stack: dict[str, Any]
    work: Path
    nodes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def kubectl(self, *args: str, stdin: str = "") -> str:
        binary = Path(self.stack["kube_bin_dir"]) / "kubectl"
        command = [str(binary), "--kubeconfig", self.stack["kubeconfig"], *args]
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise StackError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def start_nodes(self, hosts: dict[str, tuple[str, str]], cni: list[str]) -> float:
        """``hosts``: name -> (namespace, agent socket); ``cni``: kube-node's network flags.
        Returns the seconds until every Node was Ready."""
        started = time.perf_counter()
        for host, (netns, socket) in hosts.items():
            argv = [
                *(sys.executable, "-m", "podwire.cli.main", "kube-node"),
                *("--data-dir", str(self.stack["data_dir"]), "--host", host, "--netns", netns),
                *("--agent-socket", socket, *cni),
            ]
            with (self.work / f"{host}-kube-node.log").open("ab") as log:
                self.nodes[host] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log)
        for host, proc in self.nodes.items():
            assert proc.stdout is not None
            if not proc.stdout.readline():
                raise StackError(f"kube-node {host} exited; see {self.work}/{host}-kube-node.log")
        self.kubectl("create", "namespace", NAMESPACE)
        account = ("serviceaccount", "-n", NAMESPACE, "default")
        self.wait(lambda: self._get(*account) is not None, f"{NAMESPACE}'s ServiceAccount")
        return time.perf_counter() - started

    def _get(self, *args: str) -> dict[str, Any] | None:
        out = self.kubectl("get", *args, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def wait(self, done: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
        """``done``'s first truthy answer."""
        deadline = time.monotonic() + timeout
        while True:
            if found := done():
                return found
            if time.monotonic() > deadline:
                raise StackError(f"{what}: not there after {timeout:.0f} s")
            time.sleep(0.2)

    def apply(self, *manifests: dict[str, Any]) -> None:
        items = {"apiVersion": "v1", "kind": "List", "items": list(manifests)}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(items))

    def running(self, names: list[str], timeout: float = 120.0) -> dict[str, dict[str, Any]]:
        """The pods once all are Running (one listing per poll)."""

        def listed() -> dict[str, dict[str, Any]] | None:
            pods = (self._get("pods", "-n", NAMESPACE) or {}).get("items", [])
            up = {p["metadata"]["name"]: p for p in pods if p["status"].get("phase") == "Running"}
            return up if set(names) <= set(up) else None

        return self.wait(listed, f"pods {', '.join(names)} Running", timeout)

    def annotations(self) -> dict[str, dict[str, str]]:
        """Each pod's annotations (pod name -> annotations), in one listing."""
        pods = (self._get("pods", "-n", NAMESPACE) or {}).get("items", [])
        return {p["metadata"]["name"]: p["metadata"].get("annotations", {}) for p in pods}

    def output(self, pod: str, *command: str) -> str | None:
        """``command``'s output in ``pod``, or None if it failed."""
        try:
            return self.kubectl("exec", "-n", NAMESPACE, pod, "--", *command)
        except StackError:
            return None

    def exec(self, pod: str, *command: str) -> bool:
        return self.output(pod, *command) is not None

    def stop(self) -> list[str]:
        """The pods first (kubelet's CNI DELs need the agents), then the nodes and Nodes.
        Returns what went wrong: the rest of the teardown goes on."""
        problems: list[str] = []
        if not self.nodes:
            return problems
        try:
            self.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=90s")
        except StackError as exc:
            problems.append(str(exc))
        for host, proc in self.nodes.items():
            procs.stop_child(proc, timeout=120)
            if proc.returncode:
                problems.append(f"kube-node {host} exited {proc.returncode} (see its log)")
        try:
            self.kubectl("delete", "node", *self.nodes, "--ignore-not-found")
        except StackError as exc:
            problems.append(str(exc))
        self.nodes.clear()
        return problems
