"""NetworkPolicy end to end on the real data path: a connectivity truth table over 3
namespaces x 4 pods on 2 hosts, TCP and UDP on 2 ports each, probed with real connections
through the pods' veths, the hosts' bridges, VXLAN and the agents' nftables, after each of a
sequence of policy changes made with kubectl. The expected table is computed by the test
from the specification (``netpol_spec``), not by podwire's compiler.

The controller (``[kubernetes]``: its informers, compiler and reconciler) and the two agents
(enforcing security groups, VIFs from that controller) run as processes, as an operator
would run them (``podwire.demo.services``); kubelet is the real one of a kube-node per host.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from podwire.demo.services import Services
from podwire.k8s.groups import group_name
from podwire.k8s.objects import ObjectKey
from podwire.kube.images import TOOLBOX_IMAGE
from tests.kube.conftest import (
    SUBNET,
    Cluster,
    KubeNodeProcess,
    _namespace,
    container_pids,
    kubernetes_toml,
    module_services,
    pod_pid,
    stop_services,
)
from tests.kube.netpol_probe import Servers, measure, probe
from tests.kube.netpol_spec import Cell, Pod, Spec, World
from tests.kube.test_pool import NodeAgent
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns, pytest.mark.slow]

HOST_INDEXES = (8, 9)
SERVICES = (("TCP", 8080), ("TCP", 9090), ("UDP", 8080), ("UDP", 9090))
NAMED_PORTS = (("web", "TCP", 8080), ("echo", "UDP", 9090))
# p1 names the other port of each protocol: a name means what each pod says it means.
OWN_NAMED_PORTS = {"p1": (("web", "TCP", 9090), ("echo", "UDP", 8080))}
NAMESPACE_LABELS = {
    "a": {"team": "alpha", "env": "prod"},
    "b": {"team": "beta", "env": "prod"},
    "c": {"team": "gamma", "env": "dev"},
}
# name: (labels, index of the host); each namespace has two pods on each host.
POD_LABELS = {
    "p0": ({"app": "web", "tier": "front"}, 0),
    "p1": ({"app": "web", "tier": "back"}, 1),
    "p2": ({"app": "db", "tier": "back", "role": "primary"}, 0),
    "p3": ({"app": "db"}, 1),
}
CONVERGE = 120.0  # seconds a scenario may take to show on every cell


@dataclass
class Policed:
    """The hosts of this module, its pods and what the test believes the API holds."""

    cluster: Cluster
    services: Services
    hosts: list[str]
    nodes: list[KubeNodeProcess]
    world: World = field(default_factory=World)
    netns: dict[str, str] = field(default_factory=dict)  # pod key -> its namespace file
    servers: Servers = field(default_factory=Servers)

    def ns(self, alias: str) -> str:
        return f"{self.cluster.namespace}-{alias}"

    def key(self, alias: str, pod: str) -> str:
        return f"{self.ns(alias)}/{pod}"

    def ip(self, alias: str, pod: str) -> str:
        return self.world.pods[self.key(alias, pod)].ip

    @property
    def selector(self) -> str:
        return f"podwire-table={self.cluster.namespace}"

    async def apply(self, alias: str, name: str, spec: Spec) -> None:
        self.world.policies[(self.ns(alias), name)] = spec
        body = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": self.ns(alias)},
            "spec": spec,
        }
        await self.cluster.kubectl.run("apply", "-f", "-", stdin=json.dumps(body))

    async def delete(self, alias: str, name: str) -> None:
        del self.world.policies[(self.ns(alias), name)]
        await self.cluster.kubectl.run("delete", "networkpolicy", "-n", self.ns(alias), name)

    async def label_pod(self, alias: str, pod: str, **labels: str | None) -> None:
        _relabel(self.world.pods[self.key(alias, pod)].labels, labels)
        await self.cluster.kubectl.run(
            "label", "pod", "-n", self.ns(alias), pod, "--overwrite", *_label_args(labels)
        )

    async def label_namespace(self, alias: str, **labels: str | None) -> None:
        _relabel(self.world.namespaces[self.ns(alias)], labels)
        await self.cluster.kubectl.run(
            "label", "namespace", self.ns(alias), "--overwrite", *_label_args(labels)
        )

    def cells(self) -> list[Cell]:
        return [
            Cell(source, target, protocol, port)
            for source in self.world.pods
            for target in self.world.pods
            if source != target
            for protocol, port in SERVICES
        ]

    def expected(self) -> dict[Cell, bool]:
        return {cell: self.world.allowed(cell) for cell in self.cells()}

    async def measured(self) -> dict[Cell, bool]:
        addresses = {key: pod.ip for key, pod in self.world.pods.items()}
        return await measure(self.netns, addresses, self.cells())


def _relabel(labels: dict[str, str], changes: dict[str, str | None]) -> None:
    for key, value in changes.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value


def _label_args(changes: dict[str, str | None]) -> list[str]:
    return [f"{key}-" if value is None else f"{key}={value}" for key, value in changes.items()]


def _pod_manifest(policed: Policed, alias: str, name: str) -> dict[str, Any]:
    labels, host = POD_LABELS[name]
    ports = [
        {"name": port_name, "protocol": protocol, "containerPort": number}
        for port_name, protocol, number in OWN_NAMED_PORTS.get(name, NAMED_PORTS)
    ]
    container = {
        "name": "toolbox",
        "image": TOOLBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
        "ports": ports,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": policed.ns(alias),
            "labels": {**labels, "podwire-table": policed.cluster.namespace},
        },
        "spec": {
            "containers": [container],
            "nodeName": policed.hosts[host],
            "terminationGracePeriodSeconds": 1,
        },
    }


async def _listed_pods(policed: Policed) -> dict[str, dict[str, Any]]:
    listed = await policed.cluster.kubectl.get("pods", "-A", "-l", policed.selector) or {}
    return {
        f"{pod['metadata']['namespace']}/{pod['metadata']['name']}": pod
        for pod in listed.get("items", [])
    }


async def _running(policed: Policed, count: int) -> dict[str, dict[str, Any]]:
    async def listing() -> dict[str, dict[str, Any]] | None:
        pods = await _listed_pods(policed)
        await asyncio.sleep(0.5)
        running = [pod for pod in pods.values() if pod["status"].get("phase") == "Running"]
        return pods if len(running) == count else None

    return await eventually(listing, f"{count} pods Running", 180)


async def _learn_pods(policed: Policed, listed: dict[str, dict[str, Any]]) -> None:
    """Each pod's address from the API and its namespace file from its container's pid."""
    pids = await container_pids(policed.nodes)
    for key, pod in listed.items():
        policed.world.pods[key].ip = pod["status"]["podIP"]
        policed.netns[key] = f"/proc/{pod_pid(pod, pids)}/ns/net"


async def _make_pods(policed: Policed) -> None:
    for alias, labels in NAMESPACE_LABELS.items():
        name = policed.ns(alias)
        await _namespace(policed.cluster.kubectl, name)
        policed.world.namespaces[name] = {}
        await policed.label_namespace(alias, **labels)
        policed.world.namespaces[name] |= {"kubernetes.io/metadata.name": name}
    pods = [
        _pod_manifest(policed, alias, name) for alias in NAMESPACE_LABELS for name in POD_LABELS
    ]
    for manifest in pods:
        meta = manifest["metadata"]
        policed.world.pods[f"{meta['namespace']}/{meta['name']}"] = Pod(
            meta["namespace"],
            meta["name"],
            dict(meta["labels"]),
            OWN_NAMED_PORTS.get(meta["name"], NAMED_PORTS),
        )
    body = {"apiVersion": "v1", "kind": "List", "items": pods}
    await policed.cluster.kubectl.run("apply", "-f", "-", stdin=json.dumps(body))
    await _learn_pods(policed, await _running(policed, len(pods)))
    for key in policed.world.pods:
        await policed.servers.serve(policed.netns[key], SERVICES)


@pytest.fixture(scope="module")
async def policed(cluster: Cluster) -> AsyncIterator[Policed]:
    """A controller with ``[kubernetes]`` for the cluster's project, an enforcing agent and a
    kube-node on each of two hosts of this module, and the 12 pods, serving."""
    services = module_services(cluster, "netpol", "INFO")
    hosts = [cluster.host_name(index) for index in HOST_INDEXES]
    kubernetes = kubernetes_toml(cluster)
    nodes: list[KubeNodeProcess] = []
    made = Policed(cluster, services, hosts, nodes)
    try:
        await asyncio.to_thread(services.start_controller, hosts, kubernetes)
        for index, host in zip(HOST_INDEXES, hosts, strict=True):
            netns, vtep = cluster.netenv.host(cluster.address_base + index)
            socket = await asyncio.to_thread(services.start_agent, host, netns, vtep)
            nodes.append(await cluster.start_node(NodeAgent(host, netns, socket)))  # type: ignore[arg-type]
        await _make_pods(made)
        yield made
    finally:
        made.servers.close()
        await _clean_up(made)


async def _clean_up(policed: Policed) -> None:
    kubectl = policed.cluster.kubectl
    names = [policed.ns(alias) for alias in NAMESPACE_LABELS]
    await kubectl.run("delete", "namespace", *names, "--ignore-not-found", "--wait=false")

    async def gone() -> bool:
        return not await _listed_pods(policed)

    try:
        await eventually(gone, "the table's pods deleted", 120)
    finally:
        await stop_services(policed.cluster, policed.services, policed.hosts, policed.nodes)


def _differences(expected: dict[Cell, bool], measured: dict[Cell, bool]) -> list[str]:
    return [
        f"{cell}: expected {'open' if want else 'blocked'}, measured "
        f"{'open' if measured[cell] else 'blocked'}"
        for cell, want in expected.items()
        if measured[cell] != want
    ]


async def _converges(policed: Policed, title: str) -> float:
    """Probe rounds until the measured table is the expected one; seconds it took."""
    expected = policed.expected()
    started = time.monotonic()
    measured: dict[Cell, bool] = {}
    while time.monotonic() - started < CONVERGE:
        measured = await policed.measured()
        if measured == expected:
            return time.monotonic() - started
    differences = _differences(expected, measured)
    shown = "\n  ".join(differences[:60])
    raise AssertionError(
        f"{title}: {len(differences)} cells differ after {CONVERGE:.0f} s:\n  {shown}"
    )


Step = Callable[[Policed], Awaitable[None]]


async def nothing(p: Policed) -> None:
    pass


async def deny_ingress_a(p: Policed) -> None:
    await p.apply("a", "deny-in", {"podSelector": {}, "policyTypes": ["Ingress"]})


async def from_prod_namespaces(p: Policed) -> None:
    peer = {"namespaceSelector": {"matchLabels": {"env": "prod"}}}
    await p.apply("a", "from-prod", {"podSelector": {}, "ingress": [{"from": [peer]}]})


async def from_gamma_web(p: Policed) -> None:
    peer = {
        "namespaceSelector": {"matchLabels": {"team": "gamma"}},
        "podSelector": {"matchLabels": {"app": "web"}},
    }
    rule = {"from": [peer], "ports": [{"protocol": "TCP", "port": 8080}]}
    await p.apply(
        "a", "from-gamma-web", {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [rule]}
    )


async def deny_egress_b(p: Policed) -> None:
    await p.apply("b", "deny-out", {"podSelector": {}, "policyTypes": ["Egress"]})


async def egress_to_blocks(p: Policed) -> None:
    blocks = [
        {"ipBlock": {"cidr": f"{p.ip(alias, pod)}/32"}} for alias, pod in (("c", "p2"), ("a", "p1"))
    ]
    spec = {
        "podSelector": {"matchLabels": {"tier": "front"}},
        "policyTypes": ["Egress"],
        "egress": [{"to": blocks}],
    }
    await p.apply("b", "to-blocks", spec)


async def match_expressions(p: Policed) -> None:
    own_not_web = {
        "podSelector": {
            "matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]
        }
    }
    untiered_where_env = {
        "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "Exists"}]},
        "podSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
    }
    spec = {
        "podSelector": {
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "back"]}]
        },
        "ingress": [{"from": [own_not_web]}, {"from": [untiered_where_env]}],
    }
    await p.apply("c", "expressions", spec)


async def ingress_block_two_excepts(p: Policed) -> None:
    excepts = [f"{p.ip('a', pod)}/32" for pod in ("p0", "p3")]
    rule = {"from": [{"ipBlock": {"cidr": SUBNET, "except": excepts}}]}
    await p.apply("c", "block", {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [rule]})


async def named_ports(p: Policed) -> None:
    rule = {
        "from": [{"namespaceSelector": {}}],
        "ports": [{"port": "web"}, {"protocol": "UDP", "port": "echo"}],
    }
    await p.apply("a", "named", {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [rule]})


async def end_port(p: Policed) -> None:
    rule = {
        "from": [{"namespaceSelector": {}}],
        "ports": [{"protocol": "UDP", "port": 8000, "endPort": 8999}],
    }
    await p.apply("c", "range", {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [rule]})


async def two_egress_policies(p: Policed) -> None:
    to_alpha = [{"namespaceSelector": {"matchLabels": {"team": "alpha"}}}]
    for name, selector, ports in (
        ("out-db", {"app": "db"}, [{"protocol": "TCP", "port": 9090}]),
        ("out-primary", {"role": "primary"}, [{"protocol": "UDP"}]),
    ):
        spec = {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Egress"],
            "egress": [{"to": to_alpha, "ports": ports}],
        }
        await p.apply("b", name, spec)


async def delete_from_prod(p: Policed) -> None:
    await p.delete("a", "from-prod")


async def pod_into_selector(p: Policed) -> None:
    await p.label_pod("c", "p3", app="web")


async def pod_out_of_selector(p: Policed) -> None:
    await p.label_pod("a", "p0", app="cache", tier=None)


async def namespace_out_of_team(p: Policed) -> None:
    await p.label_namespace("c", team="delta")


async def namespace_loses_env(p: Policed) -> None:
    await p.label_namespace("a", env=None)


async def delete_deny_egress_b(p: Policed) -> None:
    await p.delete("b", "deny-out")


async def both_directions(p: Policed) -> None:
    spec = {
        "podSelector": {"matchLabels": {"app": "web", "tier": "back"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [{"namespaceSelector": {"matchLabels": {"team": "alpha"}}}],
                "ports": [{"protocol": "UDP"}],
            }
        ],
        "egress": [{"to": [{"podSelector": {}}]}],
    }
    await p.apply("c", "both", spec)


async def egress_ports_only(p: Policed) -> None:
    spec = {
        "podSelector": {"matchLabels": {"app": "web"}},
        "policyTypes": ["Egress"],
        "egress": [{"ports": [{"protocol": "TCP", "port": 9090}]}],
    }
    await p.apply("c", "out-9090", spec)


async def from_db_everywhere(p: Policed) -> None:
    peer = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}
    await p.apply("a", "from-any-db", {"podSelector": {}, "ingress": [{"from": [peer]}]})


async def egress_to_named_port(p: Policed) -> None:
    rule = {
        "to": [{"namespaceSelector": {"matchLabels": {"team": "alpha"}}}],
        "ports": [{"port": "web"}],
    }
    spec = {
        "podSelector": {"matchLabels": {"app": "db"}},
        "policyTypes": ["Egress"],
        "egress": [rule],
    }
    await p.apply("b", "out-web", spec)


SCENARIOS: list[tuple[str, Step]] = [
    ("no policy: every cell open", nothing),
    ("default deny ingress in a", deny_ingress_a),
    ("a: ingress from the namespaces env=prod (namespace selector)", from_prod_namespaces),
    ("a's db: from gamma's web pods on TCP 8080 (namespace + pod selector)", from_gamma_web),
    ("default deny egress in b", deny_egress_b),
    ("b's front: egress to two pods' ipBlocks", egress_to_blocks),
    ("c: matchExpressions In, NotIn, Exists, DoesNotExist", match_expressions),
    ("c's db: ingress from an ipBlock with two excepts", ingress_block_two_excepts),
    ("a's web: named ports web (TCP) and echo (UDP), p1's on other numbers", named_ports),
    ("c's web: UDP 8000-8999 (endPort)", end_port),
    ("b: two egress policies whose union allows", two_egress_policies),
    ("a policy deleted (a/from-prod)", delete_from_prod),
    ("a pod relabelled into a selector (c/p3 app=web)", pod_into_selector),
    ("a pod relabelled out of selectors (a/p0 app=cache, no tier)", pod_out_of_selector),
    ("a namespace relabelled (c team=delta)", namespace_out_of_team),
    ("a namespace relabelled (a without env)", namespace_loses_env),
    ("a policy deleted (b's default deny egress)", delete_deny_egress_b),
    ("c/p1: one policy of both types", both_directions),
    ("c's web: egress on a port to any address (no peers)", egress_ports_only),
    ("a: from db pods of every namespace (empty namespace selector)", from_db_everywhere),
    ("b's db: egress to the named port web, each peer's own number", egress_to_named_port),
]


@pytest.mark.timeout(600)  # the first test of the module also sets the pods up
async def test_the_connectivity_table_follows_the_specification(policed: Policed) -> None:
    previous: dict[Cell, bool] | None = None
    timings = []
    for title, step in SCENARIOS:
        await step(policed)
        expected = policed.expected()
        # Each scenario must change what is allowed, or it would prove nothing.
        assert expected != previous, f"{title}: the expected table did not change"
        previous = expected
        seconds = await _converges(policed, title)
        opened = sum(expected.values())
        timings.append(f"{seconds:5.1f} s  {opened:3d}/{len(expected)} open  {title}")
    print("\n".join(timings))


async def _first_ip(policed: Policed, alias: str, name: str) -> str:
    """The pod's address as soon as the API has it, from a kubectl watch started before the
    pod exists: the controller's ``podwire.io/addresses`` annotation, written when the port
    is handed out, while the CNI ADD is still wiring it (before the pod's veth is up), or
    else its ``podIP``, which kubelet reports after the ADD."""
    info = policed.cluster.kubectl.info
    shown = r"{.metadata.annotations.podwire\.io/addresses}{' '}{.status.podIP}{'\n'}"
    proc = await asyncio.create_subprocess_exec(
        *(f"{info['kube_bin_dir']}/kubectl", "--kubeconfig", info["kubeconfig"]),
        *("get", "pods", "--watch", "-n", policed.ns(alias)),
        *("--field-selector", f"metadata.name={name}"),
        *("-o", f"jsonpath={shown}"),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        while line := await proc.stdout.readline():
            annotated, _, reported = line.decode().strip().partition(" ")
            if annotated:
                return str(json.loads(annotated)[0]).split("/")[0]
            if reported.strip():
                return reported.strip()
        raise AssertionError(f"kubectl's watch of {name} ended (exit {await proc.wait()})")
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def _pod_running(policed: Policed, alias: str, name: str) -> None:
    async def running() -> bool:
        pod = await policed.cluster.kubectl.get("pod", "-n", policed.ns(alias), name)
        await asyncio.sleep(0.3)
        return bool(pod and pod["status"].get("phase") == "Running")

    await eventually(running, f"{alias}/{name} Running", 120)


@dataclass
class Answers:
    """Probes of one pod from others, launched every ``EVERY`` s: when each answered."""

    launched: int = 0
    times: list[float] = field(default_factory=list)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def keep_probing(
        self, sources: list[str], target: str, address: str, netns: dict[str, str]
    ) -> None:
        while True:
            for source in sources:
                for protocol, port in SERVICES:
                    cell = Cell(source, target, protocol, port)
                    task = asyncio.create_task(self._one(netns[source], cell, address))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            await asyncio.sleep(EVERY)

    async def _one(self, netns: str, cell: Cell, address: str) -> None:
        self.launched += 1
        if await probe(netns, cell, address):
            self.times.append(time.monotonic())


EVERY = 0.2


async def test_a_new_pod_under_default_deny_answers_only_once_a_policy_allows(
    policed: Policed,
) -> None:
    """Probed from the moment the API shows its address (the controller's annotation, before
    its CNI ADD is done; across hosts and on its own host):
    nothing answers while only the default-deny policy selects it, and it answers once a
    policy allows it. The policy allows its named port ``web`` from pods that do not exist,
    and the pod names a number no other pod does, so its port waits for a group made for it
    alone (the pod's own meaning of that name) and still allows nothing."""
    p = policed
    await p.cluster.kubectl.run("delete", "networkpolicy", "--all", "-n", p.ns("a"))
    p.world.policies = {key: spec for key, spec in p.world.policies.items() if key[0] != p.ns("a")}
    nobody = {
        "from": [{"podSelector": {"matchLabels": {"app": "nobody"}}}],
        "ports": [{"port": "web"}],
    }
    spec = {"podSelector": {"matchLabels": {"app": "fresh"}}, "ingress": [nobody]}
    await p.apply("a", "deny-fresh", spec)
    group = group_name(ObjectKey(p.ns("a"), "deny-fresh"))

    async def enforced() -> bool:
        groups = await asyncio.to_thread(p.cluster.neutron.network.security_groups, name=group)
        return bool(list(groups))

    # The pod must come after the policy: a pod made before its policy is open meanwhile.
    await eventually(enforced, "the default-deny policy's group in Neutron", 60)
    manifest = _pod_manifest(p, "a", "p2")
    manifest["metadata"] |= {"name": "fresh", "labels": {"app": "fresh"}}
    web = {"name": "web", "protocol": "TCP", "containerPort": 7777}
    manifest["spec"]["containers"][0]["ports"] = [web]
    watching = asyncio.create_task(_first_ip(p, "a", "fresh"))
    answers = Answers()
    probing = None
    try:
        await p.cluster.kubectl.run("apply", "-f", "-", stdin=json.dumps(manifest))
        address = await asyncio.wait_for(watching, 120)
        sources = [p.key("a", "p0"), p.key("a", "p1")]  # the fresh pod's host, and the other
        probing = asyncio.create_task(
            answers.keep_probing(sources, f"{p.ns('a')}/fresh", address, p.netns)
        )
        await _pod_running(p, "a", "fresh")
        await asyncio.sleep(3)  # and probed a while longer
        launched, applied = answers.launched, time.monotonic()
        await p.apply(
            "a",
            "allow-fresh",
            {
                "podSelector": {"matchLabels": {"app": "fresh"}},
                "ingress": [{"from": [{"podSelector": {}}]}],
            },
        )

        async def answered() -> bool:
            return bool(answers.times)

        await eventually(answered, "an answer from the new pod once a policy allows it", 60)
        early = [round(applied - when, 2) for when in answers.times if when < applied]
        assert not early, f"answered {early} s before the allowing policy was made"
        assert launched >= 50, f"only {launched} probes before the policy"
    finally:
        watching.cancel()
        if probing is not None:
            probing.cancel()
        await asyncio.gather(*answers.tasks, return_exceptions=True)
        await p.cluster.kubectl.run("delete", "pod", "-n", p.ns("a"), "fresh", "--ignore-not-found")
