"""The demo's steps, each reporting progress; ``Scenario.run`` returns the report's figures."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import permutations
from pathlib import Path
from typing import Any

from podwire import keys
from podwire.config import EtcdSettings
from podwire.demo import cnf, kubestep, netpolstep, router, secgroups, servicestep, vmstep
from podwire.demo.kube import NAMESPACE, Kube, kubelet_root
from podwire.demo.kube import missing as kube_missing
from podwire.demo.pods import Pod, cni, cni_conf, new_pod
from podwire.demo.services import Services
from podwire.demo.topology import Topology, pings
from podwire.errors import StackError
from podwire.etcd.client import EtcdClient
from podwire.kube.manifests import testpmd_pod
from podwire.neutron.client import neutron_connection
from podwire.neutron.routers import delete_routers
from podwire.stack.agent_conf import agent_log
from podwire.stack.neutron_agent import agent_base

HOSTS = ("demo-node-1", "demo-node-2")
CIDR = "10.88.0.0/24"
UNWIRE_TIMEOUT = 15.0


def step(message: str) -> None:
    print(f"==> {message}", flush=True)


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


@dataclass
class Figures:
    pods: int = 0
    ports: int = 0
    pings: int = 0
    pool_hits: float = 0
    released: int = 0
    recycled: int = 0
    add_ms: list[float] = field(default_factory=list)
    active_ms: list[float] = field(default_factory=list)
    more: list[str] = field(default_factory=list)  # the later steps' lines

    def lines(self) -> list[str]:
        return [
            f"pods attached: {self.pods} on {len(HOSTS)} hosts; Neutron ports: {self.ports}",
            f"pod-to-pod pings: {self.pings} of {self.pods * (self.pods - 1)} answered",
            f"pool hits: {self.pool_hits:.0f} of {len(self.add_ms)} ADDs;"
            f" {self.recycled} of {self.released} released ports recycled into the pools",
            f"CNI ADD: p50 {statistics.median(self.add_ms):.1f} ms,"
            f" p99 {p99(self.add_ms):.1f} ms ({len(self.add_ms)} ADDs)",
            f"pool port bound -> ACTIVE: p50 {statistics.median(self.active_ms):.0f} ms"
            f" ({len(self.active_ms)} ports)",
            *self.more,
        ]


class Scenario:
    def __init__(self, stack: dict[str, Any], work: Path, pod_count: int) -> None:
        self.neutron = neutron_connection(stack["neutron"])
        self.etcd_url = str(stack["etcd"])
        self.services = Services(work, stack["etcd"], stack["neutron"])
        self.topology = Topology()
        self.pod_count = pod_count
        self.project = uuid.uuid4().hex
        self.pods: list[Pod] = []
        self.sockets: dict[str, str] = {}
        self.netns: dict[str, str] = {}  # host -> its namespace
        self.confs: dict[str, dict[str, Any]] = {}
        self.figures = Figures()
        self.work = work
        self.kube_missing = kube_missing()
        self.kube = Kube(stack, work)
        self.nodes_ready_s = 0.0
        self.memif_missing = self.kube_missing or cnf.missing()
        self.vm_missing = vmstep.missing()
        self.stack_dir = str(stack["data_dir"])
        self.router_missing = router.missing()
        self.outside = ""  # the router step's outside namespace
        self.routers: list[str] = []  # their qrouter- namespaces must be gone at the end

    def run(self) -> Figures:
        self._start_hosts()
        network, sg = self._network()
        self._populate(network.id, sg.id)
        self._start_nodes(network.id, sg.id)
        self.confs = {
            host: cni_conf(network.id, self.project, sg.id, self.sockets[host]) for host in HOSTS
        }
        self._attach([new_pod(f"pod-{i}", "", HOSTS[i % 2]) for i in range(self.pod_count)])
        self._check_connectivity()
        self._recreate_half()
        self._check_connectivity()
        self.figures.pods = len(self.pods)
        self.figures.ports = len(list(self.neutron.network.ports(project_id=self.project)))
        self.figures.pool_hits = self.services.metric("podwire_pool_hits_total")
        self._kubernetes()  # its pods take pooled ports too: after the CNI figures
        self._security_groups(network.id)
        self._router(network.id, sg.id)
        self._services()
        self._memif_cnf(network.id, sg.id)
        self._vm(network.id, sg.id)
        return self.figures

    def _start_hosts(self) -> None:
        step("creating 2 simulated hosts (network namespaces on an underlay bridge)")
        hosts = self.topology.build_hosts(len(HOSTS))
        step("starting the controller and one agent per host")
        self.services.start_controller(list(HOSTS), self._kubernetes_toml())
        memif_host = ""
        if self.memif_missing:
            step(f"{self.memif_missing}: the memif step is skipped")
        else:  # host 1's agent serves memif: its device plugin registers with its kubelet
            memif_host = cnf.settings_toml(kubelet_root(self.stack_dir, HOSTS[0]), self.work)
        uplink = ""
        if self.router_missing:
            step(f"{self.router_missing}: the router step is skipped")
        else:  # host 1 serves the external network: its uplink goes to an outside namespace
            self.outside = self.topology.namespace("outside")
            router.make_outside(hosts[0][0], self.outside)
            uplink = router.agent_toml()
        for index, (host, (netns, vtep)) in enumerate(zip(HOSTS, hosts, strict=True)):
            extra = uplink + memif_host if index == 0 else ""
            self.sockets[host] = self.services.start_agent(host, netns, vtep, extra)
            self.netns[host] = netns
        # Neutron's agents for host 1, registered by the time their steps need them.
        if self.vm_missing:
            step(f"{self.vm_missing}: the VM step is skipped")
        else:
            self.services.start_neutron_agent("dhcp", self.stack_dir, HOSTS[0], hosts[0][0])
        if not self.router_missing:
            self.services.start_neutron_agent("l3", self.stack_dir, HOSTS[0], hosts[0][0])

    def _kubernetes_toml(self) -> str:
        """The controller's Kubernetes side (NetworkPolicy) for the kube pods' project."""
        if self.kube_missing:
            return ""
        kubeconfig = self.kube.stack["kubeconfig"]
        return f'[kubernetes]\nkubeconfig = "{kubeconfig}"\nproject_id = "{self.project}"\n'

    def _network(self) -> tuple[Any, Any]:
        network = self.neutron.network.create_network(name="demo-pods", project_id=self.project)
        self.neutron.network.create_subnet(
            network_id=network.id, cidr=CIDR, ip_version=4, project_id=self.project
        )
        sg = self.neutron.network.create_security_group(name="demo", project_id=self.project)
        # A new group only lets traffic out; like a default group, admit its own members
        # (the agents enforce it: docs/security-groups.md).
        self.neutron.network.create_security_group_rule(
            security_group_id=sg.id, direction="ingress", ethertype="IPv4", remote_group_id=sg.id
        )
        step(f"VXLAN network {network.id} (VNI {network.provider_segmentation_id})")
        return network, sg

    def _populate(self, network_id: str, sg_id: str) -> None:
        per_host = self.pod_count // len(HOSTS) + 2
        step(f"pre-populating pools: {per_host} ports per host")
        started = time.perf_counter()
        self.services.admin(
            "POST",
            "/v1/pools/populate",
            {
                "nodes": list(HOSTS),
                "network": network_id,
                "project_id": self.project,
                "security_groups": [sg_id],
                "count": per_host,
            },
        )
        bound_at = time.perf_counter()
        self.figures.active_ms = self._wait_active(per_host * len(HOSTS), bound_at)
        step(
            f"pools ready: {per_host * len(HOSTS)} ports created and bound in"
            f" {bound_at - started:.1f} s, all ACTIVE {time.perf_counter() - started:.1f} s"
        )

    def _wait_active(self, expected: int, since: float) -> list[float]:
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 120
        while len(seen) < expected and time.monotonic() < deadline:
            for port in self.neutron.network.ports(project_id=self.project, status="ACTIVE"):
                seen.setdefault(port.id, (time.perf_counter() - since) * 1000)
            time.sleep(0.05)
        if len(seen) < expected:
            raise StackError(f"only {len(seen)} of {expected} pool ports became ACTIVE")
        return list(seen.values())

    def _attach(self, pods: list[Pod]) -> None:
        step(f"attaching {len(pods)} pods through the CNI plugin")
        for pod in pods:
            pod.netns = self.topology.pod(pod.name)
            elapsed, result = cni("ADD", pod, self.confs[pod.host])
            pod.ip = result["ips"][0]["address"].split("/")[0]
            pod.port_id = self._port_of(result)
            self.figures.add_ms.append(elapsed)
            self.pods.append(pod)

    def _attach_extra(self, name: str, host: str, conf: dict[str, Any]) -> tuple[Pod, Any]:
        """A pod for a later step: torn down with the others, not in the ADD figures."""
        pod = new_pod(name, self.topology.pod(name), host)
        self.pods.append(pod)  # before the ADD: a failed ADD's pod is still DELeted
        _, result = cni("ADD", pod, conf)
        pod.ip = result["ips"][0]["address"].split("/")[0]
        return pod, result

    def _security_groups(self, network_id: str) -> None:
        step(f"security groups: tcp/{secgroups.TCP_PORT} to a pod whose group has no ingress rule")
        group = secgroups.create_locked_group(self.neutron, self.project)
        conf = dict(self.confs[HOSTS[0]], securityGroups=[group])
        server, _ = self._attach_extra("sg-server", HOSTS[0], conf)
        open_pod = next(p for p in self.pods if p.host == HOSTS[0] and p is not server)
        client = next(p for p in self.pods if p.host == HOSTS[1])
        figures = secgroups.run(self.neutron, group, server, open_pod, client, CIDR)
        step("security groups: the Neutron rule let it in; a spoofed source stays out")
        self.figures.more += figures.lines()

    def _router(self, network_id: str, sg_id: str) -> None:
        if self.router_missing:
            self.figures.more += router.RouterFigures(skipped=self.router_missing).lines()
            return
        step("router: a second network, and a Neutron router with a gateway to the outside")
        self._wait_neutron_agent(HOSTS[0], "L3 agent")
        second, made = router.build(self.neutron, self.project, network_id)
        self.routers.append(str(made.id))
        groups = [sg_id, router.public_group(self.neutron, self.project)]
        conf = cni_conf(second.id, self.project, sg_id, self.sockets[HOSTS[1]])
        client, result = self._attach_extra("routed", HOSTS[1], dict(conf, securityGroups=groups))
        target = next(p for p in self.pods if p.host == HOSTS[0] and p is not client)
        step(f"router: {client.name} on network 2 (host 2) pings {target.name}, the outside,"
             " then answers the outside on a floating IP")  # fmt: skip
        l3_log = agent_log(agent_base(Path(self.stack_dir), HOSTS[0], "l3"), "l3")
        figures = router.check(self.neutron, self.project, made, (client.netns,
                               self._port_of(result)), target.ip, self.outside, l3_log)  # fmt: skip
        self.figures.more += figures.lines()

    def _start_nodes(self, network_id: str, sg_id: str) -> None:
        if self.kube_missing:
            step(f"{self.kube_missing}: the Kubernetes steps are skipped")
            return
        step("Kubernetes: kube-node (containerd + kubelet) on each host, as Nodes of the stack")
        hosts = {host: (self.netns[host], self.sockets[host]) for host in HOSTS}
        group = netpolstep.kube_group(self.neutron, self.project, sg_id)
        flags = ["--network", network_id, "--project", self.project, "--security-group", group]
        self.nodes_ready_s = self.kube.start_nodes(hosts, flags)
        step(f"Kubernetes: {len(HOSTS)} Nodes Ready in {self.nodes_ready_s:.0f} s")

    def _kubernetes(self) -> None:
        if self.kube_missing:
            self.figures.more += kubestep.KubeFigures(skipped=self.kube_missing).lines()
            return
        step("Kubernetes: 4 pods through kube-apiserver (kubectl apply), 2 per host")
        figures = kubestep.run(self.kube, self.neutron, HOSTS, self.pods, self.nodes_ready_s)
        self.figures.more += figures.lines()

    def _services(self) -> None:
        missing = self.kube_missing or self.router_missing
        if not missing and "cluster_dns" not in self.kube.stack:
            missing = "the stack runs without CoreDNS (scripts/setup builds it)"
        if missing:
            self.figures.more += servicestep.ServiceFigures(skipped=missing).lines()
            return
        step("Services: web (a backend on each host) by its name from a kube pod on host 2")
        servicestep.route_to_machine(self.outside, router.EXTERNAL_CIDR)
        figures = servicestep.run(self.kube, HOSTS, "kube-pod-2")
        self.figures.more += figures.lines()

    def _memif_cnf(self, network_id: str, sg_id: str) -> None:
        if self.memif_missing:
            self.figures.more += cnf.CnfFigures(skipped=self.memif_missing).lines()
            return
        step("memif: a CNF pod asking kubelet for podwire.io/memif on host 1 runs dpdk-testpmd")
        self.kube.apply(testpmd_pod("cnf", NAMESPACE, HOSTS[0]))
        self.kube.running(["cnf"])
        address = cnf.memif_address(self.work / "memif")
        client = next(p for p in self.pods if p.host == HOSTS[1])
        step(f"memif: pinging the CNF's memif address {address} from {client.name} on host 2")
        logs = f"kubectl logs -n {NAMESPACE} cnf"
        self.figures.more += cnf.ping_cnf(client.netns, address, 50, logs).lines()

    def _vm(self, network_id: str, sg_id: str) -> None:
        if self.vm_missing:
            self.figures.more += vmstep.VmFigures(skipped=self.vm_missing).lines()
            return
        step("VM: QEMU on host 1 on the tap it makes; its address from Neutron's DHCP agent")
        self._wait_neutron_agent(HOSTS[0], "DHCP agent")
        client = next(p for p in self.pods if p.host == HOSTS[1])
        figures = vmstep.run(
            self.neutron,
            self.project,
            network_id,
            sg_id,
            (HOSTS[0], self.netns[HOSTS[0]]),
            (client.netns, client.ip),
            self.work,
        )
        self.figures.more += figures.lines()

    def _wait_neutron_agent(self, host: str, kind: str, timeout: float = 90.0) -> None:
        """``kind``: Neutron's agent type ("DHCP agent", "L3 agent")."""
        deadline = time.monotonic() + timeout
        while not any(a.is_alive for a in self.neutron.network.agents(host=host, agent_type=kind)):
            if time.monotonic() > deadline:
                raise StackError(f"Neutron's {kind} of {host} is not alive after {timeout} s")
            time.sleep(0.2)

    def _port_of(self, result: dict[str, Any]) -> str:
        mac = next(i["mac"] for i in result["interfaces"] if i.get("sandbox"))
        ports = list(self.neutron.network.ports(project_id=self.project, mac_address=mac))
        return str(ports[0].id) if ports else ""

    def _check_connectivity(self) -> None:
        pairs = list(permutations(self.pods, 2))
        step(f"checking {len(pairs)} pod-to-pod pings across both hosts")
        with ThreadPoolExecutor(8) as pool:
            answered = list(pool.map(lambda pair: pings(pair[0].netns, pair[1].ip), pairs))
        self.figures.pings = sum(answered)
        if not all(answered):
            failed = [f"{a.name}->{b.name}" for (a, b), ok in zip(pairs, answered, strict=True)]
            raise StackError(f"{len(pairs) - sum(answered)} pings failed, e.g. {failed[:3]}")

    def _recreate_half(self) -> None:
        half = self.pods[::2]
        step(f"deleting {len(half)} pods, then creating them again (ports return to the pool)")
        released = set()
        for pod in half:
            cni("DEL", pod, self.confs[pod.host])
            released.add(pod.port_id)
            self.topology.remove(pod.netns)
            self.pods.remove(pod)
        self.figures.released = len(released)
        self.figures.recycled = len(self._wait_pooled(released))
        self._attach([new_pod(pod.name, "", pod.host) for pod in half])

    def _pooled_ports(self) -> set[str]:
        pools = self.services.admin("GET", "/v1/pools")["pools"]
        return {port for pool in pools for group in pool["groups"] for port in group["ports"]}

    def _wait_pooled(self, released: set[str]) -> set[str]:
        """Released ports come back to their pools (at once while the mirror answers).

        Waits for those very ports: a refill landing meanwhile also grows the pools.
        """
        deadline = time.monotonic() + 60
        while not released <= (pooled := self._pooled_ports()):
            if time.monotonic() > deadline:
                return released & pooled
            time.sleep(0.2)
        return released

    async def _wait_unwired(self, within: float) -> None:
        """Until no host has a desired or wired port left (or ``within`` seconds passed:
        what is left then is reported as left behind)."""
        async with await EtcdClient.connect(EtcdSettings(endpoints=[self.etcd_url])) as etcd:
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                left = 0
                for host in HOSTS:
                    for prefix in (keys.node_ports_prefix(host), keys.state_ports_prefix(host)):
                        left += len((await etcd.get_prefix(prefix))[0])
                if not left:
                    return
                await asyncio.sleep(0.1)

    async def _etcd_leftovers(self) -> list[str]:
        async with await EtcdClient.connect(EtcdSettings(endpoints=[self.etcd_url])) as etcd:
            found = []
            for host in HOSTS:
                for prefix in (keys.node_ports_prefix(host), keys.vifs_prefix(host)):
                    found += [f"etcd key {kv.key}" for kv in (await etcd.get_prefix(prefix))[0]]
                state, _ = await etcd.get_prefix(keys.state_node_prefix(host))
                found += [f"etcd key {kv.key}" for kv in state if "/ports/" in kv.key]
                found += [f"etcd key {kv.key}" for kv in state if kv.key.endswith("/alive")]
            return found

    def teardown(self) -> list[str]:
        """Remove everything the demo made; returns what could not be removed."""
        problems = self.kube.stop()
        for pod in list(self.pods):
            cni("DEL", pod, self.confs[pod.host])
        delete_routers(self.neutron, self.project)  # while the L3 agent runs to unplug them
        self.services.stop_neutron_agents()
        if self.services.children.get("controller"):
            self.services.admin("POST", "/v1/pools/free", {"nodes": list(HOSTS)})
        for port in list(self.neutron.network.ports(project_id=self.project)):
            self.neutron.network.delete_port(port)
        # The agents unwire what the forwarder takes away only while they run.
        asyncio.run(self._wait_unwired(UNWIRE_TIMEOUT))
        self.services.stop()
        for network in list(self.neutron.network.networks(project_id=self.project)):
            self.neutron.network.delete_network(network)
        for group in list(self.neutron.network.security_groups(project_id=self.project)):
            self.neutron.network.delete_security_group(group)
        # The NetworkPolicy address groups, once no group's rule names them.
        for peers in list(self.neutron.network.address_groups(project_id=self.project)):
            self.neutron.network.delete_address_group(peers)
        self.topology.destroy()
        left = asyncio.run(self._etcd_leftovers())
        left += [f"namespace {name}" for name in self.topology.leftovers(self.routers)]
        left += [f"port {p.id}" for p in self.neutron.network.ports(project_id=self.project)]
        return problems + left
