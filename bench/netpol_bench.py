"""NetworkPolicy through Neutron: podwire's groups and address groups beside kuryr-kubernetes'
approach (one security-group rule per pod address), on the same Neutron in the same run.

Needs bench.run's stack with ``--kubernetes``. One namespace holds ``POLICIES`` policies:
policy i isolates pods labelled ``tier=t{i % TIERS}`` for ingress and admits, on two TCP ports,
pods labelled ``team=a{i % TEAMS}``. Pods are API objects (a nodeSelector nothing matches keeps
kubelets away) whose status the bench patches with the address of the port the controller
handed out, as kubelet reports a pod's IP after its CNI ADD. The controller runs in this
event loop with ``[kubernetes]``, two registered nodes and a pool warm for every pod, and
reaches Neutron through ``NeutronCounter``: every request it sends is counted, lists included.

Rows (time from the first step until Neutron holds the result, read straight from Neutron):
- pod start with the policies in force: the VIF request (the port takes its groups from the
  pool's update), the pod's IP reported, until the IP is in its selector's address group.
  Reference: kuryr's per pod work, one port update plus one rule per (policy naming the pod
  as a peer, port), each remote_ip_prefix the pod's /32.
- a policy created: until its group holds its rules and every selected pod's port carries it.
  Reference: a group, a rule per (peer pod, port), the selected ports updated.
- a pod relabelled into another peer selector: until its IP left one address group and is in
  the other. Reference: the old rules deleted and the new ones created.
Neutron requests per operation are rows of their own (unit "calls"), ours against kuryr's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes_asyncio import client as kube_client

from bench.controllers import QUIET_POOL, controller_settings, register_node, serving_controller
from bench.harness import delete_project, forget_nodes, kube_api, project_network, stack_etcd
from bench.neutron_counter import NeutronCounter
from bench.stats import row
from podwire.config import KubernetesSettings, NeutronSettings
from podwire.controller.app import Controller
from podwire.etcd.client import EtcdClient
from podwire.k8s.groups import group_name
from podwire.k8s.objects import ObjectKey
from podwire.neutron.client import neutron_connection
from podwire.schema.vif import PodRef, VifRequest

POLICIES = 20
TIERS = 4
TEAMS = 5
PODS_MAX = 200
CHANGES_MAX = 10  # policies created, pods relabelled
PORTS = (8000, 9000)  # policy i admits PORTS[k] + i
POLL = 0.02
TIMEOUT = 60.0


@dataclass
class Sample:
    ms: list[float] = field(default_factory=list)
    calls: list[float] = field(default_factory=list)


@dataclass
class World:
    conn: Any  # straight to Neutron: what the bench reads is not counted
    counter: NeutronCounter
    core: Any
    netpol: Any
    namespace: str
    project: str
    network_id: str
    nodes: list[str]
    ips: dict[str, str] = field(default_factory=dict)  # pod name -> address
    ports: dict[str, str] = field(default_factory=dict)  # pod name -> port id
    teams: dict[str, int] = field(default_factory=dict)
    counted: Any = None  # the reference's connection, through the counter


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    return asyncio.run(_run(stack, max(10, min(samples, PODS_MAX))))


async def _run(stack: dict[str, Any], pods: int) -> list[dict[str, Any]]:
    etcd = await stack_etcd(stack)
    counter = NeutronCounter(stack["neutron"])
    await counter.start()
    api = await kube_api(stack["kubeconfig"])
    conn = neutron_connection(stack["neutron"])
    suffix = uuid.uuid4().hex[:8]
    world = World(
        conn,
        counter,
        kube_client.CoreV1Api(api),
        kube_client.NetworkingV1Api(api),
        f"pwb-np-{suffix}",
        uuid.uuid4().hex,
        "",
        [f"pwb-np-{suffix}-{n}" for n in (1, 2)],
    )
    try:
        return await _measure(stack, etcd, world, pods)
    finally:
        await world.core.delete_namespace(world.namespace)
        await api.close()
        await counter.stop()
        await forget_nodes(etcd, *world.nodes)
        await etcd.close()
        await asyncio.to_thread(delete_project, conn, world.project)


async def _measure(
    stack: dict[str, Any], etcd: EtcdClient, world: World, pods: int
) -> list[dict[str, Any]]:
    net, _ = project_network(world.conn, world.project, "bench-netpol", "10.97.0.0/20")
    world.network_id = net.id
    for node in world.nodes:
        await register_node(etcd, node)
    await world.core.create_namespace({"metadata": {"name": world.namespace}})
    for index in range(POLICIES):
        await world.netpol.create_namespaced_network_policy(world.namespace, _policy(index))
    reference_groups = [
        world.conn.network.create_security_group(project_id=world.project, name=f"kuryr-{i}").id
        for i in range(POLICIES)
    ]
    async with serving_controller(_controller_settings(stack, world), etcd) as ctl:
        for node in world.nodes:
            await ctl.admin.populate([node], net.id, world.project, [], pods // 2 + 1)
        starts, kuryr_starts = Sample(), Sample()
        for index in range(pods):
            await _pod_start(ctl, world, index, starts)
            async with _measured(world, kuryr_starts, settle=False):
                await asyncio.to_thread(_kuryr_start, world, reference_groups, index)
        created, kuryr_created = Sample(), Sample()
        relabelled, kuryr_relabelled = Sample(), Sample()
        for index in range(min(CHANGES_MAX, pods)):
            await _policy_created(world, POLICIES + index, created)
            await _kuryr_policy_created(world, POLICIES + index, kuryr_created)
            await _relabel(world, f"p{index}", relabelled)
            await _kuryr_relabel(world, reference_groups, f"p{index}", kuryr_relabelled)
    return _rows(pods, starts, kuryr_starts, created, kuryr_created, relabelled, kuryr_relabelled)


def _rows(pods: int, *samples: Sample) -> list[dict[str, Any]]:
    starts, k_starts, created, k_created, moved, k_moved = samples
    kuryr = "kuryr: a rule per pod address"
    where = f"{POLICIES} policies, {pods} pods"
    result = []
    for what, ours, theirs in (
        (f"NetworkPolicy: pod start, in force in Neutron ({where})", starts, k_starts),
        (f"NetworkPolicy: policy created, in force on its pods ({where})", created, k_created),
        (f"NetworkPolicy: pod relabelled, its address moved ({where})", moved, k_moved),
    ):
        result.append(row(what, ours.ms, kuryr, theirs.ms))
        result.append(row(f"{what}: Neutron requests", ours.calls, kuryr, theirs.calls, "calls"))
    return result


def _controller_settings(stack: dict[str, Any], world: World) -> Any:
    return replace(
        controller_settings(stack, {node: node for node in world.nodes}, QUIET_POOL),
        neutron=NeutronSettings(endpoint=world.counter.endpoint),
        kubernetes=KubernetesSettings(kubeconfig=stack["kubeconfig"], project_id=world.project),
    )


def _policy(index: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"np{index}"},
        "spec": {
            "podSelector": {"matchLabels": {"tier": f"t{index % TIERS}"}},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"team": f"a{index % TEAMS}"}}}],
                    "ports": [{"protocol": "TCP", "port": base + index} for base in PORTS],
                }
            ],
        },
    }


async def _pod_start(ctl: Controller, world: World, index: int, sample: Sample) -> None:
    name, team = f"p{index}", index % TEAMS
    labels = {"tier": f"t{index % TIERS}", "team": f"a{team}"}
    made = await world.core.create_namespaced_pod(world.namespace, _pod(name, labels))
    ref = PodRef(world.namespace, name, made.metadata.uid)
    async with _measured(world, sample):
        request = VifRequest(f"{name}:eth0", world.network_id, world.project, (), ref)
        vif = await ctl.broker.request(world.nodes[index % 2], request)
        address = vif.fixed_ips[0].ip_address
        status = {"status": {"podIP": address, "podIPs": [{"ip": address}]}}
        await world.core.patch_namespaced_pod_status(name, world.namespace, status)
        await _until(lambda: _in_group_of(world, address, team), f"{name} in its address group")
    world.ips[name], world.ports[name], world.teams[name] = address, vif.port_id, team


def _pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"podwire.io/bench": "no-node"},
            "containers": [{"name": "c", "image": "none"}],
        },
    }


def _kuryr_start(world: World, groups: list[str], index: int) -> None:
    """A port with the groups of the policies that select the pod, then, for each policy
    naming it as a peer, a rule per port from its /32."""
    net = _counted(world)
    selecting = [groups[i] for i in range(POLICIES) if i % TIERS == index % TIERS]
    port = net.create_port(
        network_id=world.network_id, project_id=world.project, security_groups=selecting
    )
    address = port.fixed_ips[0]["ip_address"]
    for policy in range(POLICIES):
        if policy % TEAMS == index % TEAMS:
            _kuryr_rules(net, groups[policy], policy, address)


def _kuryr_rules(net: Any, group: str, policy: int, address: str) -> None:
    for base in PORTS:
        net.create_security_group_rule(
            security_group_id=group,
            direction="ingress",
            ethertype="IPv4",
            protocol="tcp",
            port_range_min=base + policy,
            port_range_max=base + policy,
            remote_ip_prefix=f"{address}/32",
        )


async def _policy_created(world: World, index: int, sample: Sample) -> None:
    selected = {world.ports[name] for name in world.ports if int(name[1:]) % TIERS == index % TIERS}
    name = group_name(ObjectKey(world.namespace, f"np{index}"))
    async with _measured(world, sample):
        await world.netpol.create_namespaced_network_policy(world.namespace, _policy(index))
        await _until(lambda: _carried(world, name, selected), f"policy np{index} on its pods")


async def _kuryr_policy_created(world: World, index: int, sample: Sample) -> None:
    peers = [world.ips[n] for n, team in world.teams.items() if team == index % TEAMS]
    selected = [world.ports[n] for n in world.ports if int(n[1:]) % TIERS == index % TIERS]

    def work() -> None:
        net = _counted(world)
        group = net.create_security_group(project_id=world.project, name=f"kuryr-np{index}")
        for address in peers:
            _kuryr_rules(net, group.id, index, address)
        for port_id in selected:  # the port's groups, as kuryr's pod handler sets them
            net.update_port(port_id, security_groups=[group.id])

    async with _measured(world, sample, settle=False):
        await asyncio.to_thread(work)


async def _relabel(world: World, name: str, sample: Sample) -> None:
    old = world.teams[name]
    new = (old + 1) % TEAMS
    address = world.ips[name]

    def moved() -> bool:
        return _in_group_of(world, address, new) and not _in_group_of(world, address, old)

    async with _measured(world, sample):
        patch = {"metadata": {"labels": {"team": f"a{new}"}}}
        await world.core.patch_namespaced_pod(name, world.namespace, patch)
        await _until(moved, f"{name}'s address moved")
    world.teams[name] = new


async def _kuryr_relabel(world: World, groups: list[str], name: str, sample: Sample) -> None:
    address = world.ips[name]
    new = world.teams[name]

    def work() -> None:
        net = _counted(world)
        for rule in net.security_group_rules(remote_ip_prefix=f"{address}/32"):
            if rule.security_group_id in groups:
                net.delete_security_group_rule(rule.id)
        for policy in range(POLICIES):
            if policy % TEAMS == new:
                _kuryr_rules(net, groups[policy], policy, address)

    async with _measured(world, sample, settle=False):
        await asyncio.to_thread(work)


def _counted(world: World) -> Any:
    """The reference goes through the counting proxy too."""
    if world.counted is None:
        world.counted = neutron_connection(world.counter.endpoint)
    return world.counted.network


def _in_group_of(world: World, address: str, team: int) -> bool:
    """The address is in the address group of the selector ``team=a<team>``."""
    wanted = f'["team", "In", ["a{team}"]]'  # the selector's key in the description
    for group in world.conn.network.address_groups(project_id=world.project):
        if wanted in str(group.description) and f"{address}/32" in (group.addresses or ()):
            return True
    return False


def _carried(world: World, name: str, ports: set[str]) -> bool:
    found = list(world.conn.network.security_groups(project_id=world.project, name=name))
    if not found or not found[0].security_group_rules:
        return False
    # Filtered by Neutron: listing every port of the project 50 times a second loaded the
    # very Neutron the controller was waiting on.
    listed = world.conn.network.ports(project_id=world.project, security_group_ids=[found[0].id])
    return ports <= {port.id for port in listed}


@contextlib.asynccontextmanager
async def _measured(world: World, sample: Sample, settle: bool = True) -> AsyncIterator[None]:
    """The block's time, and the Neutron requests sent from its start: with ``settle``, until
    the controller has sent none for 0.3 s (the tail of a pass counts: it is the operation's
    cost); without, until the block's end (the reference's own calls)."""
    before = world.counter.total
    started = time.perf_counter()
    yield
    sample.ms.append((time.perf_counter() - started) * 1000)
    last = world.counter.total
    while settle:
        await asyncio.sleep(0.3)
        if world.counter.total == last:
            break
        last = world.counter.total
    sample.calls.append(float(last - before))


async def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise RuntimeError(f"netpol bench: {what} not seen in {TIMEOUT:.0f} s")
        await asyncio.sleep(POLL)
