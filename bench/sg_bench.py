"""Security groups on the agent: how fast a change is in force, what ADD and throughput pay.

- policy change -> in force: a rule changed in etcd (the forwarder's write) until the agent's
  nft transaction is done, on a node with 500 enforced ports, 3 groups x 20 rules; reference:
  ``nft -f`` of the whole ruleset, what an agent that rewrites its tables per change pays.
- member added -> admitted: the same for a remote-group member.
- restart reconcile: a fresh enforcer adopting 500 ports until its one replace is in force.
- warm CNI ADD with SGs vs bridge+host-local (the cni bench's set-up, the agent enforcing).
- iperf3 between two pods on one bridge: their group has 1,000 rules vs port security off.
- Neutron API -> in force: a rule created through the API, a member port created in the
  group, from the API's answer until the enforcer (watching the stack's etcd, fed by the real
  ml2 forwarder) has applied it; next to the Neutron call itself.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
import uuid
from typing import Any

from bench import cni_bench
from bench.harness import (
    delete_project,
    forget_nodes,
    iperf,
    iperf_server,
    project_network,
    running,
    stack_etcd,
    until,
)
from bench.stats import row, timed
from podwire import keys
from podwire.agent import naming
from podwire.agent.policy.enforcer import EnforcerSettings, PolicyEnforcer
from podwire.etcd import EtcdClient
from podwire.netfilter import Nftables
from podwire.neutron.client import neutron_connection
from podwire.schema.secgroups import GroupMember, Rule, SecurityGroup
from podwire.sgpolicy import ruleset
from podwire.sgpolicy.compile import PolicyInputs, PortPolicy, compile_ruleset
from tests.agent.netenv import NetEnv, in_ns
from tests.agent.sgnet import SgHost, numbered_ports, wait_applied
from tests.etcd_tools import delete_prefix

PORTS = 500


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    rows = asyncio.run(_policy_rows(stack, min(samples, 200)))
    rows += asyncio.run(_member_apply_rows(min(samples, 200)))
    group = SecurityGroup(str(uuid.uuid4()), _rules(0, 20))
    rows += cni_bench.with_agent(stack, samples, group, _measure_adds)
    rows += asyncio.run(_neutron_rows(stack, min(samples, 30)))
    rows += _throughput_rows()
    return rows


def _rules(g: int, count: int, remote: str | None = None) -> tuple[Rule, ...]:
    """``count`` rules: TCP ranges from prefixes, egress, and (with ``remote``) ICMP from the
    members of that group."""
    rules = [
        _tcp_in(1000 + 10 * r, 1005 + 10 * r, f"10.{g}.{r % 250}.0/24") for r in range(count - 3)
    ]
    rules.append(Rule(str(uuid.uuid4()), "ingress", "IPv4", 1, None, None, None, remote))
    rules.append(Rule(str(uuid.uuid4()), "egress", "IPv4"))
    rules.append(Rule(str(uuid.uuid4()), "egress", "IPv6"))
    return tuple(rules)


def _tcp_in(low: int, high: int, prefix: str | None) -> Rule:
    return Rule(str(uuid.uuid4()), "ingress", "IPv4", 6, low, high, prefix)


async def _policy_rows(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    env = NetEnv()
    etcd = await stack_etcd(stack)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    groups = [SecurityGroup(sg, _rules(g, 20, sg)) for g, sg in enumerate(ids)]
    host_ns = env.namespace("sgb")
    host = f"{env.tag}-sgb"
    nft = Nftables(host_ns)
    try:
        for group in groups:
            await etcd.put(keys.secgroup(group.sg_id), group.encode().encode())
        ports = numbered_ports(PORTS, tuple(g.sg_id for g in groups))
        change: list[float] = []
        member: list[float] = []
        reconcile: list[float] = []
        for i in range(max(3, samples // 20)):
            enforcer = PolicyEnforcer(etcd, nft, EnforcerSettings(host), None)
            async with running(enforcer.run()):
                await enforcer._listed.wait()
                started = time.perf_counter()
                enforcer.adopt(ports)
                await enforcer.synced.wait()
                reconcile.append((time.perf_counter() - started) * 1000)
                if i == 0:
                    change, member = await _changes(etcd, enforcer, groups[0], samples)
                    reference_text = ruleset.replace(enforcer._compile()[0].ruleset)
        reference = _nft_cli(host_ns, reference_text, max(3, samples // 20))
    finally:
        nft.close()
        for group in groups:
            await etcd.delete(keys.secgroup(group.sg_id))
            await delete_prefix(etcd, keys.remote_groups_prefix(group.sg_id))
        await forget_nodes(etcd, host)
        await etcd.close()
        env.cleanup()
    where = f"{PORTS} ports, 3 groups x 20 rules"
    return [
        row(name, ours, "nft -f whole ruleset", reference)
        for name, ours in (
            (f"sg rule change -> in force, agent side ({where})", change),
            ("sg remote-group member added -> admitted, agent side", member),
            (f"sg agent restart: {PORTS} ports reconciled", reconcile),
        )
    ]


async def _member_apply_rows(samples: int) -> list[dict[str, Any]]:
    """A remote group's member added and removed again, as element changes of its one-field
    interval set: packed into one netlink batch, against the same change as libnftables
    text, alternately in one namespace."""
    env = NetEnv()
    remote = str(uuid.uuid4())
    group = SecurityGroup(str(uuid.uuid4()), _rules(0, 20, remote))
    ports = [PortPolicy(*found) for found in numbered_ports(20, (group.sg_id,))]
    members = [f"10.1.{i}.7" for i in range(50)]

    def compiled(found: list[str]) -> ruleset.Ruleset:
        inputs = PolicyInputs({group.sg_id: group}, {remote: {"m": tuple(found)}}, {}, ports)
        return compile_ruleset(inputs, naming.DEVICES).ruleset

    fallbacks: list[str] = []
    nft = Nftables(env.namespace("sgm"), on_fallback=fallbacks.append)
    packed: list[float] = []
    text: list[float] = []
    try:
        base, more = compiled(members), compiled([*members, "10.9.0.1"])
        await nft.apply(ruleset.replace(base))
        changes = [ruleset.change(base, more), ruleset.change(more, base)]
        for _ in range(samples):
            for change in changes:
                assert change is not None and change.elements_only
                started = time.perf_counter()
                await nft.apply_elements(change.elements)
                packed.append((time.perf_counter() - started) * 1000)
                undo = changes[1] if change is changes[0] else changes[0]
                assert undo is not None
                await nft.apply(undo.text())
                started = time.perf_counter()
                await nft.apply(change.text())
                text.append((time.perf_counter() - started) * 1000)
    finally:
        nft.close()
        env.cleanup()
    assert not fallbacks, fallbacks
    return [
        row(
            "sg remote-group member change applied (packed netlink batch)",
            packed,
            "the same change as libnftables text",
            text,
        )
    ]


async def _changes(
    etcd: EtcdClient, enforcer: PolicyEnforcer, group: SecurityGroup, samples: int
) -> tuple[list[float], list[float]]:
    change, member = [], []
    for i in range(samples):
        rules = (
            *group.rules,
            Rule(str(uuid.uuid4()), "ingress", "IPv4", 17, 2000 + i, 2000 + i, None),
        )
        value = SecurityGroup(group.sg_id, rules, revision=i).encode().encode()
        revision = await etcd.put(keys.secgroup(group.sg_id), value)
        change.append(await timed(wait_applied, enforcer, revision))
        added = GroupMember(str(uuid.uuid4()), (f"10.200.{i // 250}.{i % 250}/32",))
        key = keys.remote_group_member(group.sg_id, added.port_id)
        revision = await etcd.put(key, added.encode().encode())
        member.append(await timed(wait_applied, enforcer, revision))
    return change, member


def _nft_cli(host_ns: str, text: str, samples: int) -> list[float]:
    with tempfile.NamedTemporaryFile("w", suffix=".nft") as file:
        file.write(text)
        file.flush()
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            in_ns(host_ns, "nft", "-f", file.name)
            times.append((time.perf_counter() - started) * 1000)
    return times


def _measure_adds(plugins: cni_bench.Plugins, samples: int) -> list[dict[str, Any]]:
    times = plugins.singles(samples)  # the cni bench's ADD and DEL, its reference's
    return [
        row(
            "cni ADD, warm port, SGs enforced (20 rules)",
            times["add"],
            "bridge+host-local ADD",
            times["ref_add"],
        )
    ]


# -- through the real Neutron --------------------------------------------------------


async def _neutron_rows(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    conn = neutron_connection(stack["neutron"])
    project = uuid.uuid4().hex
    env = NetEnv()
    etcd = await stack_etcd(stack)
    host_ns = env.namespace("sgn")
    nft = Nftables(host_ns)
    sg = conn.network.create_security_group(name="pw-bench-sg", project_id=project)
    network, _ = project_network(conn, project, "pw-bench-sg", "10.67.0.0/20")
    enforcer = PolicyEnforcer(etcd, nft, EnforcerSettings(f"{env.tag}-sgn"), None)
    task = asyncio.create_task(enforcer.run())
    rule_ms, rule_api, member_ms, member_api = [], [], [], []
    try:
        enforcer.adopt(numbered_ports(20, (sg.id,)))
        await enforcer.synced.wait()
        for i in range(samples):
            took, api = await rule_create_in_force(conn, enforcer, sg.id, 3000 + i)
            rule_ms.append(took)
            rule_api.append(api)
            started = time.perf_counter()
            port = conn.network.create_port(
                network_id=network.id, project_id=project, security_group_ids=[sg.id]
            )
            returned = time.perf_counter()
            address = f"{port.fixed_ips[0]['ip_address']}/32"
            await until(
                lambda found=address: found in _member_addresses(enforcer, sg.id), 10, 0.001
            )
            await wait_applied(enforcer, enforcer.watcher.revision)
            member_ms.append((time.perf_counter() - returned) * 1000)
            member_api.append((returned - started) * 1000)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        nft.close()
        delete_project(conn, project)
        await forget_nodes(etcd, f"{env.tag}-sgn")
        await etcd.close()
        env.cleanup()
    return [
        row(
            "sg Neutron rule create returned -> in force on the node",
            rule_ms,
            "the Neutron rule create call",
            rule_api,
        ),
        row(
            "sg Neutron member port created -> admitted on the node",
            member_ms,
            "the Neutron port create call",
            member_api,
        ),
    ]


async def rule_create_in_force(
    conn: Any, enforcer: PolicyEnforcer, sg_id: str, port: int
) -> tuple[float, float]:
    """A TCP ``port`` ingress rule created through Neutron: ms from the API's answer until the
    enforcer's pass with it is in force, and ms of the API call."""
    started = time.perf_counter()
    rule = conn.network.create_security_group_rule(
        security_group_id=sg_id,
        direction="ingress",
        ethertype="IPv4",
        protocol="tcp",
        port_range_min=port,
        port_range_max=port,
    )
    returned = time.perf_counter()
    await until(lambda: rule.id in _rule_ids(enforcer, sg_id), 10, 0.001)
    await wait_applied(enforcer, enforcer.watcher.revision)
    return (time.perf_counter() - returned) * 1000, (returned - started) * 1000


def _rule_ids(enforcer: PolicyEnforcer, sg_id: str) -> set[str]:
    group = enforcer.store.groups.get(sg_id)
    return {r.rule_id for r in group.rules} if group else set()


def _member_addresses(enforcer: PolicyEnforcer, sg_id: str) -> set[str]:
    return {a for found in enforcer.store.members.get(sg_id, {}).values() for a in found}


# -- throughput -----------------------------------------------------------------------


def _throughput_rows() -> list[dict[str, Any]]:
    enforced = _iperf(port_security=True)
    off = _iperf(port_security=False)
    return [
        row(
            "iperf3 pod->pod one host, 1,000 rules (Gbit/s, higher is better)",
            enforced,
            "port security off",
            off,
            unit="Gbit/s",
        )
    ]


def _iperf(port_security: bool, runs: int = 3) -> list[float]:
    env = NetEnv()
    host = SgHost(env)
    sg = str(uuid.uuid4())
    try:
        host.start()
        client = host.pod(1, security_groups=(sg,), port_security=port_security)
        server = host.pod(2, security_groups=(sg,), port_security=port_security)
        rules = [_tcp_in(10000 + r, 10000 + r, f"10.{r // 200}.{r % 200}.0/24") for r in range(998)]
        rules += [_tcp_in(5201, 5201, None), Rule(str(uuid.uuid4()), "egress", "IPv4")]
        group = SecurityGroup(sg, tuple(rules))
        compiled = compile_ruleset(
            PolicyInputs({sg: group}, {}, {}, [p.policy() for p in host.pods]), naming.DEVICES
        )
        subprocess.run(
            ["ip", "netns", "exec", host.ns, "nft", "-f", "-"],
            input=ruleset.replace(compiled.ruleset),
            text=True,
            check=True,
            capture_output=True,
        )
        with iperf_server(server.ns):
            return [iperf(client.ns, server.ip4) for _ in range(runs)]
    finally:
        host.stop()
        env.cleanup()
