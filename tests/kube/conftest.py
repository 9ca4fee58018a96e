"""A Kubernetes cluster on two simulated hosts: the session's stack with ``--kubernetes``
(``kube_stack``, tests/conftest.py), a real podwire agent per host on that stack's etcd and
Neutron, and ``podwire kube-node`` (containerd + kubelet) per host, started once per session.

The agents run in this process's event loop: everything here that waits on kubelet, kubectl
or kube-node waits asynchronously, so the agents go on serving the CNI calls meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.agent import naming
from podwire.config import EtcdSettings
from podwire.demo.services import Services
from podwire.errors import StackError
from podwire.etcd import EtcdClient
from podwire.kube import leftovers
from podwire.kube.containerd import Containerd
from podwire.kube.images import TOOLBOX_IMAGE
from podwire.kube.kubelet import KubeletFiles
from podwire.kube.node import node_dir
from podwire.neutron.client import neutron_connection
from podwire.stack import kube_control
from tests.agent.harness import HostAgent
from tests.agent.netenv import NetEnv, links_in
from tests.conftest import delete_project_resources
from tests.scripted_agent import eventually

PODWIRE = [sys.executable, "-m", "podwire.cli.main"]
SUBNET = "10.79.0.0/24"


def require_kube_binaries() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: runs containerd and kubelet in network namespaces")
    try:
        kube_control.check_binaries(kube_control.default_bin_dir())
    except StackError as exc:
        pytest.skip(f"the Kubernetes binaries are not built: {exc}")


@dataclass
class Kubectl:
    """kubectl as the stack's admin, without blocking the event loop."""

    info: dict[str, Any]

    async def run(self, *args: str, stdin: str = "", check: bool = True) -> str:
        binary = Path(self.info["kube_bin_dir"]) / "kubectl"
        proc = await asyncio.create_subprocess_exec(
            *(str(binary), "--kubeconfig", self.info["kubeconfig"], "--request-timeout=30s"),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 90)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {err.decode().strip()}")
        return out.decode()

    async def get(self, *args: str) -> dict[str, Any] | None:
        """An object as JSON, or None if it does not exist."""
        out = await self.run("get", *args, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None


@dataclass
class KubeNodeProcess:
    """One ``podwire kube-node``, started and stopped asynchronously."""

    host: str
    proc: asyncio.subprocess.Process
    announced: dict[str, Any]
    stderr: Path

    @classmethod
    async def start(cls, data_dir: str, agent: HostAgent, network: Any, log: Path) -> Any:
        argv = [
            *PODWIRE, "kube-node", "--data-dir", data_dir, "--host", agent.host,
            "--netns", agent.netns, "--agent-socket", agent.socket,
            "--network", network.id, "--project", network.project_id, "--log-level", "INFO",
        ]  # fmt: skip
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=err
            )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 180)
        if not line:
            await proc.wait()
            raise AssertionError(f"kube-node exited {proc.returncode}: {log.read_text()[-2000:]}")
        return cls(agent.host, proc, json.loads(line), log)

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), 120)


@dataclass
class Cluster:
    kubectl: Kubectl
    info: dict[str, Any]
    neutron: Any
    network: Any
    netenv: NetEnv
    work: Path
    agents: list[HostAgent] = field(default_factory=list)
    nodes: list[KubeNodeProcess] = field(default_factory=list)
    address_base: int = field(default_factory=lambda: random.randrange(0, 224, 16))

    @property
    def namespace(self) -> str:
        return self.netenv.tag

    def host_name(self, index: int) -> str:
        return f"{self.netenv.tag}-h{index}"

    async def add_agent(self, index: int, **extra: Any) -> HostAgent:
        """Simulated host ``index`` (0-15, one per test) with its podwire agent running. Its
        address is drawn per session (192.0.2.10-.233): kube-node routes the machine's
        namespace to it, so two test sessions on one machine must not pick the same one."""
        assert self.host_name(index) not in [a.host for a in self.agents], (
            f"host index {index} is another test's: each test of this package takes its own"
        )
        ns, vtep = self.netenv.host(self.address_base + index)
        etcd = EtcdSettings(endpoints=[self.info["etcd"]])
        host = self.host_name(index)
        agent = HostAgent(host, ns, vtep, self.work, etcd, self.info["neutron"], **extra)
        self.agents.append(agent)
        await agent.start()
        return agent

    async def retire(self, node: KubeNodeProcess) -> int:
        """Stop a node a test added, and delete its Node: a stopped node's Node looks Ready
        until the node lifecycle controller's grace (40 s) ends, and the scheduler would
        place other tests' pods there. Returns kube-node's exit code."""
        code = await node.stop()
        await self.kubectl.run("delete", "node", node.host, "--ignore-not-found")
        return code

    async def start_node(self, agent: HostAgent, network: Any = None) -> KubeNodeProcess:
        """kube-node for ``agent``'s host; its conflist names ``network`` (default: the
        cluster's)."""
        log = self.work / f"{agent.host}-kube-node.log"
        network = network or self.network
        node = await KubeNodeProcess.start(self.info["data_dir"], agent, network, log)
        self.nodes.append(node)
        return node

    @property
    def hosts(self) -> list[str]:
        """The two hosts every test may use (a test may add hosts of its own)."""
        return [agent.host for agent in self.agents[:2]]

    def agent(self, host: str) -> HostAgent:
        return next(agent for agent in self.agents if agent.host == host)

    def pod_veths(self, host: str) -> set[str]:
        return {name for name in links_in(self.agent(host).netns) if naming.is_pod_veth(name)}

    def ports(self) -> list[Any]:
        return list(self.neutron.network.ports(project_id=self.network.project_id))

    async def port_of(self, uid: str) -> Any | None:
        """The Neutron port the agent made for the pod with this UID (its device_id)."""
        ports = await asyncio.to_thread(self.ports)
        return next((port for port in ports if port.device_id == uid), None)

    async def port_keys(self, host: str) -> list[str]:
        """The etcd keys of ports and attachments on ``host``: what it wants wired, what it
        reports wired, its attachments' VIFs."""
        etcd = await EtcdClient.connect(EtcdSettings(endpoints=[self.info["etcd"]]))
        try:
            found = []
            for prefix in (
                keys.node_ports_prefix(host),
                keys.state_ports_prefix(host),
                keys.vifs_prefix(host),
            ):
                items, _ = await etcd.get_prefix(prefix)
                found += [str(item.key) for item in items]
            return found
        finally:
            await etcd.close()

    async def create_pod(self, name: str, node: str = "") -> None:
        await self.kubectl.run("apply", "-f", "-", stdin=json.dumps(pod_manifest(self, name, node)))

    async def running(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        async def phase() -> dict[str, Any] | None:
            pod = await self.kubectl.get("pod", "-n", self.namespace, name)
            return pod if pod and pod["status"].get("phase") == "Running" else None

        try:
            return await eventually(phase, f"pod {name} Running", timeout)
        except AssertionError as exc:
            described = await self.kubectl.run("describe", "pod", "-n", self.namespace, name)
            raise AssertionError(f"{exc}\n{described[-3000:]}") from None

    async def all_running(self, names: list[str], timeout: float) -> list[dict[str, Any]]:
        """Many pods, with one listing per poll (a kubectl per pod per poll would starve this
        2-core machine)."""

        async def phases() -> list[dict[str, Any]] | None:
            listed = await self.kubectl.get("pods", "-n", self.namespace) or {}
            running = {
                pod["metadata"]["name"]: pod
                for pod in listed.get("items", [])
                if pod["status"].get("phase") == "Running"
            }
            await asyncio.sleep(0.5)
            return [running[name] for name in names] if set(names) <= set(running) else None

        return await eventually(phases, f"{len(names)} pods Running", timeout)

    async def exec(self, name: str, *command: str, check: bool = True) -> str:
        return await self.kubectl.run(
            "exec", "-n", self.namespace, name, "--", *command, check=check
        )

    async def delete_pod(self, name: str, *flags: str) -> None:
        await self.kubectl.run("delete", "pod", "-n", self.namespace, name, *flags)

    async def gone(self, name: str, timeout: float = 60.0) -> None:
        async def absent() -> bool:
            return await self.kubectl.get("pod", "-n", self.namespace, name) is None

        await eventually(absent, f"pod {name} gone", timeout)


def pod_manifest(cluster: Cluster, name: str, node: str = "") -> dict[str, Any]:
    """A toolbox pod that sleeps; on ``node`` if given, else wherever the scheduler puts it."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "toolbox",
                "image": TOOLBOX_IMAGE,
                "imagePullPolicy": "Never",  # imported offline: there is no registry
                "command": ["sleep", "3600"],
            }
        ],
        "terminationGracePeriodSeconds": 1,
    }
    if node:
        spec["nodeName"] = node
    metadata = {"name": name, "namespace": cluster.namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _network(neutron: Any, project: str) -> Any:
    network = neutron.network.create_network(name="pw-kube", project_id=project)
    neutron.network.create_subnet(
        network_id=network.id,
        cidr=SUBNET,
        ip_version=4,
        project_id=project,
        gateway_ip="10.79.0.1",
    )
    return network


async def _namespace(kubectl: Kubectl, name: str) -> None:
    """A namespace of the session's, once its default ServiceAccount exists (pods need it)."""
    await kubectl.run("create", "namespace", name)

    async def account() -> bool:
        return await kubectl.get("serviceaccount", "-n", name, "default") is not None

    await eventually(account, f"the default ServiceAccount of {name}", 60)


def _clean_node(data_dir: Path, agent: HostAgent) -> None:
    """kube-node's own cleanup of a killed run (nothing when it stopped cleanly)."""
    top = node_dir(data_dir, agent.host)
    if top.is_dir():
        runtime = Containerd(top / "containerd", netns=agent.netns, log_dir=top / "logs")
        leftovers.clean(top, KubeletFiles(top), runtime)


async def _forget(kubectl: Kubectl, cluster: Cluster) -> None:
    """The Nodes this package registered and its namespace (its pods go with it)."""
    hosts = [agent.host for agent in cluster.agents]
    await kubectl.run("delete", "node", *hosts, "--ignore-not-found", check=False)
    await kubectl.run("delete", "namespace", cluster.namespace, "--wait=false", check=False)


@pytest.fixture(scope="package")
async def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cluster]:
    """Two simulated hosts, each with a podwire agent and a kube-node, Ready, on the session's
    stack with ``--kubernetes`` (``kube_stack``, which fails without the binaries: skipped
    here first, saying why). The Nodes and the namespace go afterwards: other suites share
    that control plane and expect no node (tests/stack's scheduler test)."""
    require_kube_binaries()
    kube_stack: dict[str, Any] = request.getfixturevalue("kube_stack")
    neutron = neutron_connection(kube_stack["neutron"])
    project = uuid.uuid4().hex
    kubectl = Kubectl(kube_stack)
    made = Cluster(
        kubectl, kube_stack, neutron, _network(neutron, project), NetEnv(),
        tmp_path_factory.mktemp("kube"),
    )  # fmt: skip
    try:
        agents = [await made.add_agent(index) for index in (1, 2)]
        await _namespace(kubectl, made.namespace)
        for agent in agents:
            await made.start_node(agent)
        yield made
    finally:
        for node in made.nodes:
            await node.stop()
        for agent in made.agents:  # what a node killed by a failed test left, through its agent
            await asyncio.to_thread(_clean_node, Path(kube_stack["data_dir"]), agent)
        await _forget(kubectl, made)
        for agent in made.agents:
            await agent.stop()
        delete_project_resources(neutron, project)
        made.netenv.cleanup()


async def stop_services(
    cluster: Cluster, services: Services, hosts: list[str], nodes: list[KubeNodeProcess]
) -> None:
    """A module's own controller and agents (``podwire.demo.services``) gone, and what they
    leave in the cluster's project: the kube-nodes retired, the hosts' pools freed while the
    controller still runs, the processes stopped, then ``delete_groups``."""
    for node in nodes:
        await cluster.retire(node)
    controller = services.children.get("controller")
    if controller is not None and controller.poll() is None:
        body = {"nodes": hosts}
        await asyncio.to_thread(services.admin, "POST", "/v1/pools/free", body)
    await asyncio.to_thread(services.stop)
    await asyncio.to_thread(delete_groups, cluster, hosts)


def delete_groups(cluster: Cluster, hosts: list[str]) -> None:
    """What a stopped controller of a module leaves in the cluster's project: ports of
    its hosts, and ports that still carry a policy's group (a port recycling when it stopped
    keeps its groups), then the reconciler's groups and address groups, so nothing is left
    for the next controller of that project."""
    net = cluster.neutron.network
    project = cluster.network.project_id
    groups = [g for g in net.security_groups(project_id=project) if g.name.startswith("podwire-np")]
    ids = {group.id for group in groups}
    for port in list(net.ports(project_id=project)):
        if port.binding_host_id in hosts or ids & set(port.security_group_ids or ()):
            net.delete_port(port)
    for group in groups:
        net.delete_security_group(group)
    for address_group in list(net.address_groups(project_id=project)):
        if address_group.name.startswith("podwire-ag"):
            net.delete_address_group(address_group)


def module_services(cluster: Cluster, name: str, log_level: str = "") -> Services:
    """A module's own controller and agents, run as processes on the cluster's stack, in
    a work dir of their own (``name``)."""
    services = Services(cluster.work / name, cluster.info["etcd"], cluster.info["neutron"])
    services.work.mkdir()
    if log_level:
        services.log_level = log_level
    return services


def kubernetes_toml(cluster: Cluster) -> str:
    """The controller's ``[kubernetes]`` for the cluster's project (more keys may follow)."""
    return (
        f'[kubernetes]\nkubeconfig = "{cluster.info["kubeconfig"]}"\n'
        f'project_id = "{cluster.network.project_id}"\n'
    )


async def container_pids(nodes: list[KubeNodeProcess]) -> dict[str, int]:
    """containerd's tasks on ``nodes`` (container id -> pid), as ``ctr task ls`` lists them."""
    pids: dict[str, int] = {}
    for node in nodes:
        proc = await asyncio.create_subprocess_exec(
            *("ctr", "--address", node.announced["containerd_socket"], "--namespace", "k8s.io"),
            *("task", "ls"),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        rows = [line.split() for line in out.decode().splitlines()[1:]]
        pids |= {row[0]: int(row[1]) for row in rows if len(row) >= 2}
    return pids


def pod_pid(pod: dict[str, Any], pids: dict[str, int]) -> int:
    """The pid of the pod's (first) container, from the API's view of the pod."""
    return pids[pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]]
