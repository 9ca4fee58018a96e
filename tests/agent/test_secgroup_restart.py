"""The enforcer across a restart, against a real etcd and real nftables: 200 ports x 3 groups x
20 rules. The tables stay in the kernel while no enforcer runs; the next one replaces them in
one transaction with the same ruleset."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from podwire import keys
from podwire.agent import naming
from podwire.agent.metrics import AgentMetrics
from podwire.agent.policy.enforcer import EnforcerSettings, PolicyEnforcer
from podwire.etcd import EtcdClient
from podwire.netfilter import Nftables
from podwire.schema.ports import DesiredPort
from podwire.schema.secgroups import GroupMember, Rule, SecurityGroup
from podwire.sgpolicy import ruleset
from podwire.sgpolicy.compile import compile_ruleset
from tests.agent.netenv import NetEnv
from tests.agent.sgnet import nft_shape, numbered_ports, wait_applied
from tests.etcd_tools import delete_prefix

PORTS = 200


def _groups() -> list[SecurityGroup]:
    groups = []
    for g in range(3):
        sg = str(uuid.uuid4())
        rules = [
            Rule(
                str(uuid.uuid4()),
                "ingress",
                "IPv4",
                6,
                1000 + 10 * r,
                1005 + 10 * r,
                f"10.{g}.{r}.0/24",
            )
            for r in range(18)
        ]
        rules.append(Rule(str(uuid.uuid4()), "ingress", "IPv4", 1, None, None, None, sg))
        rules.append(Rule(str(uuid.uuid4()), "egress", "IPv4"))
        groups.append(SecurityGroup(sg, tuple(rules)))
    return groups


@pytest.fixture
async def published(etcd: EtcdClient) -> AsyncIterator[list[SecurityGroup]]:
    groups = _groups()
    for group in groups:
        await etcd.put(keys.secgroup(group.sg_id), group.encode().encode())
        for i in range(1, PORTS + 1, 4):
            member = GroupMember(str(uuid.uuid4()), (f"10.9.{i // 256}.{i % 256}/32",))
            await etcd.put(
                keys.remote_group_member(group.sg_id, member.port_id), member.encode().encode()
            )
    yield groups
    for group in groups:
        await etcd.delete(keys.secgroup(group.sg_id))
        await delete_prefix(etcd, keys.remote_groups_prefix(group.sg_id))


@dataclass
class Node:
    """A simulated host's namespace with podwire's nftables in it, as one enforcer sees it."""

    nft: Nftables
    host_name: str


@pytest.fixture
async def node(etcd: EtcdClient, netenv: NetEnv) -> AsyncIterator[Node]:
    host = netenv.namespace("sgn")
    found = Node(Nftables(host), f"{netenv.tag}-sgn")
    yield found
    found.nft.close()
    await delete_prefix(etcd, keys.state_node_prefix(found.host_name))


async def _run_until_synced(
    enforcer: PolicyEnforcer, ports: list[tuple[DesiredPort, str]]
) -> asyncio.Task[None]:
    task = asyncio.create_task(enforcer.run())
    enforcer.adopt(ports)
    await asyncio.wait_for(enforcer.synced.wait(), 30)
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_200_ports_3_groups_20_rules_reconciled_after_restart(
    etcd: EtcdClient, node: Node, published: list[SecurityGroup]
) -> None:
    nft, host_name = node.nft, node.host_name
    ports = numbered_ports(PORTS, tuple(g.sg_id for g in published))
    metrics = AgentMetrics()
    first = PolicyEnforcer(etcd, nft, EnforcerSettings(host_name), metrics)
    task = await _run_until_synced(first, ports)
    assert first.enforced == PORTS and not first._problems
    sample = metrics.registry.get_sample_value
    assert sample("podwire_agent_policy_applies_total", {"kind": "replace"}) == 1
    assert sample("podwire_agent_policy_enforced_ports") == PORTS
    await _stop(task)
    kept = await nft.query("list ruleset")
    secured = json.loads(await nft.query("list map bridge podwire ports"))
    [elements] = [i["map"]["elem"] for i in secured["nftables"] if "map" in i]
    assert len(elements) == PORTS  # still enforcing while no agent runs

    again = PolicyEnforcer(etcd, nft, EnforcerSettings(host_name), None)
    task = await _run_until_synced(again, list(reversed(ports)))  # ids may differ
    assert again.enforced == PORTS and again.revision >= first.revision
    await _stop(task)
    after = await nft.query("list ruleset")
    assert len(nft_shape(after)) == len(nft_shape(kept))
    assert "pol_" in after and f"rg4_{published[0].sg_id}" in after


async def test_a_group_sets_chains_outlive_its_last_port_for_keep_seconds(
    etcd: EtcdClient, node: Node, published: list[SecurityGroup]
) -> None:
    """The next pod of the set adds elements only; after ``keep_seconds`` the chains go."""
    nft = node.nft
    port, ifname = numbered_ports(1, tuple(g.sg_id for g in published))[0]
    settings = EnforcerSettings(node.host_name, keep_seconds=1.0)
    enforcer = PolicyEnforcer(etcd, nft, settings, None)
    task = await _run_until_synced(enforcer, [])
    try:
        await enforcer.enforce(port, ifname, 10)
        enforcer.forget(port.port_id)
        await wait_applied(enforcer, 0)
        await asyncio.sleep(0.2)  # the forget's apply is done well within this
        listing = await nft.query("list ruleset")
        assert "pol_" in listing and ifname not in listing  # the port is gone, its set is not
        for _ in range(50):
            await asyncio.sleep(0.1)
            if "pol_" not in await nft.query("list ruleset"):
                break
        else:
            raise AssertionError("the kept chains were not removed after keep_seconds")
    finally:
        await _stop(task)


async def test_pods_coming_and_going_leave_the_tables_a_full_compilation_builds(
    etcd: EtcdClient, node: Node, netenv: NetEnv, published: list[SecurityGroup]
) -> None:
    """ADDs and DELs change only the ports' elements (no recompilation); the kernel ends
    exactly where a replace of the whole compiled ruleset puts a fresh namespace."""
    nft, other = node.nft, Nftables(netenv.namespace("sgg"))
    all_groups = tuple(g.sg_id for g in published)
    ports = numbered_ports(30, all_groups)
    ports += [
        (DesiredPort(**{**port.__dict__, "security_groups": all_groups[:1]}), ifname)
        for port, ifname in numbered_ports(34, all_groups)[30:]
    ]
    metrics = AgentMetrics()
    enforcer = PolicyEnforcer(etcd, nft, EnforcerSettings(node.host_name), metrics)
    task = await _run_until_synced(enforcer, [])
    try:
        for port, ifname in ports:
            await enforcer.enforce(port, ifname, 10)
        for port, _ in ports[3:9] + ports[31:]:
            enforcer.forget(port.port_id)
        for port, ifname in ports[3:6]:
            await enforcer.enforce(port, ifname, 10)
        sample = metrics.registry.get_sample_value
        assert sample("podwire_agent_policy_applies_total", {"kind": "replace"}) == 1
        inputs = enforcer.store.inputs()
        inputs.ports = enforcer._port_policies()
        inputs.kept = enforcer._kept_now(inputs.ports)
        inputs.policy_ids = enforcer._policy_ids
        await other.apply(ruleset.replace(compile_ruleset(inputs, naming.DEVICES).ruleset))
        assert nft_shape(await nft.query("list ruleset")) == nft_shape(
            await other.query("list ruleset")
        )
        assert enforcer.enforced == 30 - 6 + 3 + 1
    finally:
        await _stop(task)
        other.close()
