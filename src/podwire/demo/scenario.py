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
from podwire.demo import cnf, secgroups, vmstep
from podwire.demo.pods import Pod, cni, cni_conf, new_pod
from podwire.demo.services import Services
from podwire.demo.topology import Topology, pings
from podwire.deviceplugin.model import PodName
from podwire.errors import StackError
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import neutron_connection

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
        self.memif_missing = cnf.missing()
        self.vm_missing = vmstep.missing()
        self.stack_dir = str(stack["data_dir"])
        self.kubelet: cnf.KubeletThread | None = None

    def run(self) -> Figures:
        self._start_hosts()
        network, sg = self._network()
        self._populate(network.id, sg.id)
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
        self._security_groups(network.id)
        self._memif_cnf(network.id, sg.id)
        self._vm(network.id, sg.id)
        return self.figures

    def _start_hosts(self) -> None:
        step("creating 2 simulated hosts (network namespaces on an underlay bridge)")
        hosts = self.topology.build_hosts(len(HOSTS))
        step("starting the controller and one agent per host")
        self.services.start_controller(list(HOSTS))
        memif_host = ""
        if self.memif_missing:
            step(f"{self.memif_missing}: the memif step is skipped")
        else:  # host 1's agent serves memif: its device plugin registers with a kubelet peer
            self.kubelet = cnf.KubeletThread(self.work / "kubelet")
            self.kubelet.start()
            memif_host = self.kubelet.settings_toml()
        for index, (host, (netns, vtep)) in enumerate(zip(HOSTS, hosts, strict=True)):
            extra = memif_host if index == 0 else ""
            self.sockets[host] = self.services.start_agent(host, netns, vtep, extra)
            self.netns[host] = netns
        if self.vm_missing:
            step(f"{self.vm_missing}: the VM step is skipped")
        else:  # registered with Neutron by the time the VM's port is made
            self.services.start_dhcp_agent(self.stack_dir, HOSTS[0], self.netns[HOSTS[0]])

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

    def _memif_cnf(self, network_id: str, sg_id: str) -> None:
        if self.kubelet is None:
            self.figures.more += cnf.CnfFigures(skipped=self.memif_missing).lines()
            return
        step("memif: a CNF pod with a podwire.io/memif grant on host 1 runs dpdk-testpmd")
        grant = self.kubelet.grant(PodName("demo", "cnf"), "memif-0")
        _, result = self._attach_extra("cnf", HOSTS[0], self.confs[HOSTS[0]])
        address, mac = cnf.memif_ip(result)
        client = next(p for p in self.pods if p.host == HOSTS[1])
        step(f"memif: pinging the CNF's memif address {address} from {client.name} on host 2")
        figures = cnf.ping_cnf(grant, mac, client.netns, address, self.work / "testpmd.log", 50)
        self.figures.more += figures.lines()

    def _vm(self, network_id: str, sg_id: str) -> None:
        if self.vm_missing:
            self.figures.more += vmstep.VmFigures(skipped=self.vm_missing).lines()
            return
        step("VM: QEMU on host 1 on the tap it makes; its address from Neutron's DHCP agent")
        self._wait_dhcp_agent(HOSTS[0])
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

    def _wait_dhcp_agent(self, host: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(a.is_alive for a in self.neutron.network.agents(host=host)):
            if time.monotonic() > deadline:
                raise StackError(f"Neutron's DHCP agent of {host} is not alive after {timeout} s")
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
        for pod in list(self.pods):
            cni("DEL", pod, self.confs[pod.host])
        self.services.stop_dhcp_agent()
        if self.services.children.get("controller"):
            self.services.admin("POST", "/v1/pools/free", {"nodes": list(HOSTS)})
        for port in list(self.neutron.network.ports(project_id=self.project)):
            self.neutron.network.delete_port(port)
        # The agents unwire what the forwarder takes away only while they run.
        asyncio.run(self._wait_unwired(UNWIRE_TIMEOUT))
        self.services.stop()
        if self.kubelet is not None:
            self.kubelet.stop()
        for network in list(self.neutron.network.networks(project_id=self.project)):
            self.neutron.network.delete_network(network)
        for group in list(self.neutron.network.security_groups(project_id=self.project)):
            self.neutron.network.delete_security_group(group)
        self.topology.destroy()
        left = asyncio.run(self._etcd_leftovers())
        left += [f"namespace {name}" for name in self.topology.leftovers()]
        left += [f"port {p.id}" for p in self.neutron.network.ports(project_id=self.project)]
        return left
