"""ClusterIP Services on real kubelets: a controller with ``[kubernetes]`` and two agents run as
processes, a kube-node per host, kube-controller-manager making the EndpointSlices. Three
``web`` pods (two hosts) answer every connection with their name, from sockets this test
opens in their namespaces; a client pod on the second host reaches them through the
Service's ClusterIP (TCP by a named target port, and UDP), from a socket opened in its
namespace, so each answer says which backend the translation in the client chose.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from podwire.demo.services import Services
from podwire.kube.images import TOOLBOX_IMAGE
from tests.agent.netenv import in_ns, sh
from tests.kube.conftest import (
    Cluster,
    KubeNodeProcess,
    _namespace,
    container_pids,
    kubernetes_toml,
    module_services,
    pod_pid,
    stop_services,
)
from tests.kube.netpol_probe import sockets_in
from tests.kube.test_pool import NodeAgent
from tests.neutron_agents.agents import NeutronAgentRun
from tests.neutron_agents.conftest import L3_AGENT, alive_in_neutron
from tests.neutron_agents.routing import router_ports_active
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns, pytest.mark.slow]

HOST_INDEXES = (11, 12)
PHYSNET = "svcext"
UPLINK = "phys0"
EXTERNAL_PREFIX = "100.66.0"  # not 198.51.100: the stack finds its address by routing there
WEB = {"web-0": 0, "web-1": 1, "web-2": 0}  # pod -> host index in HOST_INDEXES
CLIENT = ("client", 1)
TCP_PORT, UDP_PORT = 8080, 5353
TIMEOUT = 1.0


class _Named(asyncio.Protocol):
    def __init__(self, name: bytes) -> None:
        self.name = name

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.name)  # type: ignore[attr-defined]
        transport.close()


class _NamedEcho(asyncio.DatagramProtocol):
    def __init__(self, name: bytes) -> None:
        self.name = name

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.transport.sendto(self.name, addr)  # type: ignore[attr-defined]


@dataclass
class Serving:
    cluster: Cluster
    services: Services
    hosts: list[str]
    nodes: list[KubeNodeProcess]
    netns: dict[str, str] = field(default_factory=dict)  # pod -> its namespace file
    roots: dict[str, Path] = field(default_factory=dict)  # pod -> its container's root
    closers: list[Any] = field(default_factory=list)
    namespace: str = ""
    uplink: str = ""  # the machine's end of the first host's uplink
    host_ns: list[str] = field(default_factory=list)  # each host's namespace

    def __post_init__(self) -> None:
        self.namespace = self.namespace or f"{self.cluster.namespace}-svc"

    async def serve(self, pod: str) -> None:
        await self.serve_as(pod, pod.encode())

    async def serve_as(self, pod: str, name: bytes) -> None:
        """Answer every connection to ``pod`` with ``name``."""
        loop = asyncio.get_running_loop()
        tcp, udp = await sockets_in(self.netns[pod], ["TCP", "UDP"])
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind(("0.0.0.0", TCP_PORT))
        tcp.listen(128)
        udp.bind(("0.0.0.0", UDP_PORT))
        self.closers.append(await loop.create_server(lambda: _Named(name), sock=tcp))
        transport, _ = await loop.create_datagram_endpoint(lambda: _NamedEcho(name), sock=udp)
        self.closers.append(transport)

    async def ask(self, address: str, port: int, kind: str, times: int) -> list[str]:
        """What ``times`` connections (or datagrams) from the client got: a name, or
        "silent" / "refused"."""
        return [await self._ask_once(address, port, kind) for _ in range(times)]

    async def _ask_once(self, address: str, port: int, kind: str) -> str:
        loop = asyncio.get_running_loop()
        (sock,) = await sockets_in(self.netns[CLIENT[0]], [kind])
        with contextlib.closing(sock):
            try:
                async with asyncio.timeout(TIMEOUT):
                    await loop.sock_connect(sock, (address, port))
                    if kind == "UDP":
                        await loop.sock_sendall(sock, b"?")
                    return (await loop.sock_recv(sock, 64)).decode() or "closed"
            except TimeoutError:
                return "silent"
            except OSError as exc:
                return type(exc).__name__


def _pod(serving: Serving, name: str, host: int, labels: dict[str, str]) -> dict[str, Any]:
    container = {
        "name": "toolbox",
        "image": TOOLBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", "echo yes > /tmp/ready; exec sleep 3600"],
        "ports": [{"name": "http", "containerPort": TCP_PORT}],
        # Unready once this test writes something else into the file.
        "readinessProbe": {
            "exec": {"command": ["grep", "-q", "yes", "/tmp/ready"]},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": serving.namespace, "labels": labels},
        "spec": {
            "containers": [container],
            "nodeName": serving.hosts[host],
            "terminationGracePeriodSeconds": 1,
        },
    }


def _service(serving: Serving) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": serving.namespace},
        "spec": {
            "selector": {"app": "web"},
            "ports": [
                {"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"},
                {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": UDP_PORT},
            ],
        },
    }


async def _ready_pods(serving: Serving, count: int) -> dict[str, Any]:
    async def listing() -> dict[str, Any] | None:
        listed = await serving.cluster.kubectl.get("pods", "-n", serving.namespace) or {}
        pods = {pod["metadata"]["name"]: pod for pod in listed.get("items", [])}
        ready = [
            pod
            for pod in pods.values()
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in pod["status"].get("conditions", [])
            )
        ]
        return pods if len(ready) == count else None

    return await eventually(listing, f"{count} pods Ready", 180)


async def _learn(serving: Serving, pods: dict[str, Any]) -> None:
    pids = await container_pids(serving.nodes)
    for name, pod in pods.items():
        pid = pod_pid(pod, pids)
        serving.netns[name] = f"/proc/{pid}/ns/net"
        serving.roots[name] = Path(f"/proc/{pid}/root")


@pytest.fixture(scope="module")
async def serving(cluster: Cluster) -> AsyncIterator[Serving]:
    services = module_services(cluster, "services", "INFO")
    hosts = [cluster.host_name(index) for index in HOST_INDEXES]
    kubernetes = kubernetes_toml(cluster)
    made = Serving(cluster, services, hosts, [])
    try:
        await asyncio.to_thread(services.start_controller, hosts, kubernetes)
        for index, host in zip(HOST_INDEXES, hosts, strict=True):
            netns, vtep = cluster.netenv.host(cluster.address_base + index)
            made.host_ns.append(netns)
            extra = ""
            if index == HOST_INDEXES[0]:  # the network node: the uplink to the machine
                made.uplink = _uplink(netns)
                extra = f'physnet_mappings = {{ {PHYSNET} = "{UPLINK}" }}\n'
            sock = await asyncio.to_thread(services.start_agent, host, netns, vtep, extra)
            node = await cluster.start_node(NodeAgent(host, netns, sock))  # type: ignore[arg-type]
            made.nodes.append(node)
        await _namespace(cluster.kubectl, made.namespace)
        manifests = [_pod(made, name, host, {"app": "web"}) for name, host in WEB.items()]
        manifests.append(_pod(made, CLIENT[0], CLIENT[1], {"app": "client"}))
        body = {"apiVersion": "v1", "kind": "List", "items": [*manifests, _service(made)]}
        await cluster.kubectl.run("apply", "-f", "-", stdin=json.dumps(body))
        await _learn(made, await _ready_pods(made, len(manifests)))
        for name in WEB:
            await made.serve(name)
        yield made
    finally:
        for closer in made.closers:
            closer.close()
        await _clean_up(made)


async def _clean_up(serving: Serving) -> None:
    kubectl = serving.cluster.kubectl
    await kubectl.run("delete", "namespace", serving.namespace, "--ignore-not-found")
    await stop_services(serving.cluster, serving.services, serving.hosts, serving.nodes)
    if serving.uplink:
        sh("ip", "link", "del", serving.uplink, check=False)


def _uplink(host_ns: str) -> str:
    """A veth from the host's ``phys0`` to this machine's own namespace, which gets the
    external network's first address: what the router's source NAT reaches the apiserver
    through (its address is this machine's). Returns the machine's end."""
    machine_end = f"pwsx{uuid.uuid4().hex[:8]}"
    sh("ip", "link", "add", machine_end, "type", "veth", "peer", "name", UPLINK, "netns", host_ns)
    sh("ip", "addr", "add", f"{EXTERNAL_PREFIX}.1/24", "dev", machine_end)
    sh("ip", "link", "set", machine_end, "up")
    in_ns(host_ns, "ip", "link", "set", UPLINK, "up")
    return machine_end


@dataclass
class Routed:
    router: Any
    external: Any
    l3: NeutronAgentRun


@pytest.fixture(scope="module")
async def routed(serving: Serving) -> AsyncIterator[Routed]:
    """Neutron's L3 agent on the first host, a flat external network on its uplink, and a
    router with its gateway there and an interface on the pods' network: the pods' way to
    addresses outside every network, as an OpenStack cloud gives it."""
    cluster = serving.cluster
    net = cluster.neutron.network
    project = cluster.network.project_id
    netns = serving.host_ns[0]
    out = cluster.work / "services-l3.err"
    l3 = NeutronAgentRun(Path(cluster.info["data_dir"]), serving.hosts[0], netns, out, kind="l3")
    external = router = subnet = None
    try:
        await alive_in_neutron(cluster.neutron, serving.hosts[0], L3_AGENT)
        external = net.create_network(
            name="pw-svc-ext", project_id=project, provider_physical_network=PHYSNET,
            provider_network_type="flat", is_router_external=True,
        )  # fmt: skip
        net.create_subnet(
            network_id=external.id, cidr=f"{EXTERNAL_PREFIX}.0/24", ip_version=4,
            project_id=project, gateway_ip=f"{EXTERNAL_PREFIX}.1", is_dhcp_enabled=False,
            allocation_pools=[{"start": f"{EXTERNAL_PREFIX}.10", "end": f"{EXTERNAL_PREFIX}.99"}],
        )  # fmt: skip
        router = net.create_router(
            name="pw-svc", project_id=project, external_gateway_info={"network_id": external.id}
        )
        subnet = next(iter(net.subnets(network_id=cluster.network.id)))
        net.add_interface_to_router(router, subnet_id=subnet.id)
        await router_ports_active(cluster.neutron, router.id, 2)
        yield Routed(router, external, l3)
    finally:
        if router is not None:
            if subnet is not None:
                with contextlib.suppress(Exception):
                    net.remove_interface_from_router(router, subnet_id=subnet.id)
            net.delete_router(router, ignore_missing=True)
        l3.stop()
        for agent in net.agents(host=serving.hosts[0], agent_type=L3_AGENT):
            net.delete_agent(agent)
        if external is not None:
            for port in list(net.ports(network_id=external.id)):
                net.delete_port(port)
            net.delete_network(external)


async def _cluster_ip(serving: Serving) -> str:
    found = await serving.cluster.kubectl.get("service", "-n", serving.namespace, "web")
    assert found is not None
    return str(found["spec"]["clusterIP"])


async def _answers(
    serving: Serving, kind: str, port: int, times: int, want: set[str], within: float = 30
) -> list[str]:
    """Rounds of ``times`` until the answers are exactly ``want``; the last round's."""
    address = await _cluster_ip(serving)
    last: list[list[str]] = [[]]

    async def matches() -> bool:
        last[0] = await serving.ask(address, port, kind, times)
        return set(last[0]) == want

    try:
        await eventually(matches, f"{kind} {address}:{port} answered by {sorted(want)}", within)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last round: {last[0]}") from None
    return last[0]


async def test_every_ready_endpoint_answers_over_tcp_and_udp(serving: Serving) -> None:
    await _answers(serving, "TCP", 80, 40, set(WEB))
    await _answers(serving, "UDP", 53, 40, set(WEB))


async def test_an_unready_endpoint_gets_no_new_connections(serving: Serving) -> None:
    ready = serving.roots["web-2"] / "tmp" / "ready"
    ready.write_text("no\n")
    try:
        await _answers(serving, "TCP", 80, 30, {"web-0", "web-1"})
    finally:
        ready.write_text("yes\n")
    await _answers(serving, "TCP", 80, 40, set(WEB))


async def test_a_policy_denying_the_endpoints_denies_the_service(serving: Serving) -> None:
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "web-closed", "namespace": serving.namespace},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]},
    }
    kubectl = serving.cluster.kubectl
    await kubectl.run("apply", "-f", "-", stdin=json.dumps(policy))
    try:
        await _answers(serving, "TCP", 80, 6, {"silent"}, within=60)
    finally:
        await kubectl.run("delete", "networkpolicy", "-n", serving.namespace, "web-closed")
    await _answers(serving, "TCP", 80, 40, set(WEB), within=60)


async def test_a_deleted_service_stops_answering(serving: Serving) -> None:
    address = await _cluster_ip(serving)
    await serving.cluster.kubectl.run("delete", "service", "-n", serving.namespace, "web")

    async def silent() -> bool:
        return set(await serving.ask(address, 80, "TCP", 3)) == {"silent"}

    await eventually(silent, f"{address}:80 no longer answered", 30)


OVERLAP_CIDR = "10.123.0.0/24"


async def test_namespaces_on_networks_with_one_cidr_each_reach_their_own_service(
    serving: Serving,
) -> None:
    """Two namespaces, each on a network of its own with the same CIDR, each with a server,
    a client and a Service: each client is only ever answered by its own namespace's server.
    Placed after the other tests: it runs its own pods beside the module's."""
    cluster, kubectl = serving.cluster, serving.cluster.kubectl
    net = cluster.neutron.network
    project = cluster.network.project_id
    networks = []
    names = [f"{serving.namespace}-ov{side}" for side in "ab"]
    try:
        for name in names:
            network = net.create_network(name=f"pw-{name}", project_id=project)
            net.create_subnet(
                network_id=network.id, cidr=OVERLAP_CIDR, ip_version=4, project_id=project
            )
            networks.append(network)
            await _namespace(kubectl, name)
            await kubectl.run("annotate", "namespace", name, f"podwire.io/network={network.id}")
        for name in names:
            overlap = Serving(
                cluster, serving.services, serving.hosts, serving.nodes, namespace=name
            )
            manifests = [
                _pod(overlap, "server", 0, {"app": "web"}),
                _pod(overlap, CLIENT[0], 1, {"app": "client"}),
                _service(overlap),
            ]
            body = {"apiVersion": "v1", "kind": "List", "items": manifests}
            await kubectl.run("apply", "-f", "-", stdin=json.dumps(body))
        answered = {}
        for name in names:
            overlap = Serving(
                cluster, serving.services, serving.hosts, serving.nodes, namespace=name
            )
            pods = await _ready_pods(overlap, 2)
            assert all(p["status"]["podIP"].startswith("10.123.0.") for p in pods.values()), pods
            await _learn(overlap, pods)
            await overlap.serve_as("server", name.encode())
            serving.closers += overlap.closers
            answered[name] = set(await _answers(overlap, "TCP", 80, 10, {name}))
        assert answered == {name: {name} for name in names}
    finally:
        for name in names:
            await kubectl.run("delete", "namespace", name, "--ignore-not-found")
        for network in networks:
            for port in list(net.ports(network_id=network.id)):
                net.delete_port(port)
            net.delete_network(network)


async def test_the_kubernetes_service_reaches_the_apiserver_through_the_router(
    serving: Serving, routed: Routed
) -> None:
    """Its endpoint is the apiserver's own address, outside every network: the pod reaches
    it through its network's router and the router's source NAT."""
    found = await serving.cluster.kubectl.get("service", "-n", "default", "kubernetes")
    assert found is not None
    address = str(found["spec"]["clusterIP"])

    async def answered() -> bool:
        return await _https_livez(serving.netns[CLIENT[0]], address) == "ok"

    await eventually(answered, f"GET https://{address}/livez from a pod answered ok", 60)


async def _https_livez(netns: str, address: str) -> str:
    (sock,) = await sockets_in(netns, ["TCP"])

    def get() -> str:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the question is reach, not trust
        sock.settimeout(3)
        try:
            sock.connect((address, 443))
            with context.wrap_socket(sock) as tls:
                tls.sendall(b"GET /livez HTTP/1.1\r\nHost: kubernetes\r\nConnection: close\r\n\r\n")
                reply = b""
                while chunk := tls.recv(4096):
                    reply += chunk
            return reply.decode(errors="replace").rsplit("\r\n\r\n", 1)[-1].strip()
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            sock.close()

    return await asyncio.to_thread(get)


async def test_a_pod_resolves_services_by_name_and_connects(
    serving: Serving, routed: Routed
) -> None:
    """The pod's resolver is the kube-dns Service (kubelet's clusterDNS), whose endpoint is the
    stack's CoreDNS on this machine: reached through the router as the apiserver is."""
    kubectl = serving.cluster.kubectl
    if serving.cluster.info.get("cluster_dns") is None:
        pytest.skip("the stack runs without CoreDNS: scripts/setup builds it")
    named = _service(serving)
    named["metadata"]["name"] = "named"
    await kubectl.run("apply", "-f", "-", stdin=json.dumps(named))
    found = await kubectl.get("service", "-n", serving.namespace, "named")
    assert found is not None
    fqdn = f"named.{serving.namespace}.svc.cluster.local"
    last = [""]

    async def resolves(name: str, address: str) -> bool:
        last[0] = await kubectl.run(
            "exec", "-n", serving.namespace, CLIENT[0], "--", "nslookup", name, check=False
        )
        return address in last[0]

    kubernetes = await kubectl.get("service", "-n", "default", "kubernetes")
    assert kubernetes is not None
    for name, address in (
        ("kubernetes.default.svc.cluster.local", kubernetes["spec"]["clusterIP"]),
        (fqdn, found["spec"]["clusterIP"]),
        ("named", found["spec"]["clusterIP"]),  # the pod's search path
    ):
        try:
            await eventually(lambda n=name, a=address: resolves(n, a), f"{name} -> {address}", 60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{last[0]}") from None

    async def connects() -> bool:
        last[0] = await kubectl.run(
            "exec", "-n", serving.namespace, CLIENT[0], "--", "nc", "-w", "2", fqdn, "80",
            check=False,
        )  # fmt: skip
        return last[0].strip() in WEB

    try:
        await eventually(connects, f"nc {fqdn} 80 answered by a web pod", 30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{last[0]}") from None
