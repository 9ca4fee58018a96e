"""Security-group policy from the real Neutron to the real etcd: groups, rules, default group,
address groups, remote-group membership, order, and the forwarder's resync."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.etcd.client import EtcdClient
from podwire.etcd.watch import PrefixWatcher, WatchEvent
from podwire.ml2.journal import SqlJournal
from podwire.schema.records import parse_ml2_report
from podwire.schema.secgroups import (
    parse_address_group,
    parse_group_member,
    parse_security_group,
)
from podwire.stack.mariadb import MariaDB
from tests.ml2.test_stack_binding import vxlan_network
from tests.scripted_agent import ScriptedAgent, bound_on, eventually

pytestmark = pytest.mark.stack


@pytest.fixture
def groups(neutron: Any, project_id: str) -> Iterator[Callable[..., Any]]:
    """Creates security groups in the test's project; they, the project's ports (which hold
    them) and its default group go afterwards."""
    created: list[Any] = []

    def create(name: str = "pw-sg", **body: Any) -> Any:
        group = neutron.network.create_security_group(name=name, project_id=project_id, **body)
        created.append(group)
        return group

    yield create
    for port in list(neutron.network.ports(project_id=project_id)):
        neutron.network.delete_port(port)
    for ag in list(neutron.network.address_groups(project_id=project_id)):
        for rule in list(neutron.network.security_group_rules(remote_address_group_id=ag.id)):
            neutron.network.delete_security_group_rule(rule)
        neutron.network.delete_address_group(ag)
    for group in list(neutron.network.security_groups(project_id=project_id)):
        neutron.network.delete_security_group(group)


async def value_of(etcd: EtcdClient, key: str) -> bytes | None:
    kv = await etcd.get(key)
    return None if kv is None else kv.value


async def group_in_etcd(
    etcd: EtcdClient, sg_id: str, probe: Callable[[Any], bool], what: str
) -> Any:
    async def check() -> Any:
        raw = await value_of(etcd, keys.secgroup(sg_id))
        if raw is None:
            return None
        parsed = parse_security_group(raw, sg_id)
        assert parsed.problems == ()
        return parsed.group if probe(parsed.group) else None

    return await eventually(check, what)


async def absent(etcd: EtcdClient, key: str, what: str) -> None:
    async def gone() -> bool:
        return await etcd.get(key) is None

    await eventually(gone, what)


@contextlib.asynccontextmanager
async def recording(etcd: EtcdClient, prefix: str) -> AsyncIterator[list[WatchEvent]]:
    """Every change under ``prefix`` as an agent's watch sees it."""
    events: list[WatchEvent] = []
    watcher = PrefixWatcher(etcd, prefix)
    started = asyncio.Event()

    async def run() -> None:
        async for batch in watcher.batches():
            events.extend(batch.events)
            started.set()

    task = asyncio.create_task(run())
    await asyncio.wait_for(started.wait(), 10)  # the initial list
    try:
        yield events
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _rule_count(event: WatchEvent) -> int:
    if event.kind != "put":
        return -1
    return len(parse_security_group(event.value).group.rules)


def rule_ids(group: Any) -> set[str]:
    return {rule.rule_id for rule in group.rules}


async def test_group_and_rules_reach_etcd_normalised_and_in_order(
    neutron: Any, etcd: EtcdClient, groups: Callable[..., Any]
) -> None:
    group = groups()
    key = keys.secgroup(group.id)
    async with recording(etcd, key) as events:
        created = await group_in_etcd(etcd, group.id, lambda g: len(g.rules) == 2, "new group")
        # A non-default group starts with Neutron's two egress rules.
        assert {(r.direction, r.ethertype, r.protocol) for r in created.rules} == {
            ("egress", "IPv4", None),
            ("egress", "IPv6", None),
        }
        assert created.stateful and created.project_id == group.project_id
        base = rule_ids(created)
        create = neutron.network.create_security_group_rule
        ssh = create(
            security_group_id=group.id, direction="ingress", ethertype="IPv4", protocol="tcp",
            port_range_min=22, port_range_max=22, remote_ip_prefix="10.1.2.3/8",
        )  # fmt: skip
        ping6 = create(
            security_group_id=group.id, direction="ingress", ethertype="IPv6", protocol="icmp",
            port_range_min=128, port_range_max=0,
        )  # fmt: skip
        sctp = create(
            security_group_id=group.id, direction="ingress", ethertype="IPv4", protocol="132",
            port_range_min=1000, port_range_max=2000, remote_group_id=group.id,
        )  # fmt: skip
        added = {ssh.id, ping6.id, sctp.id}
        full = await group_in_etcd(
            etcd, group.id, lambda g: rule_ids(g) == base | added, "three rules added"
        )
        by_id = {rule.rule_id: rule for rule in full.rules}
        assert (by_id[ssh.id].protocol, by_id[ssh.id].port_min, by_id[ssh.id].port_max) == (
            6,
            22,
            22,
        )
        # Neutron keeps the prefix as typed; its firewall (and ours) match the network.
        assert by_id[ssh.id].remote_ip_prefix == "10.0.0.0/8"
        assert (by_id[ping6.id].protocol, by_id[ping6.id].port_min) == (58, 128)
        assert by_id[sctp.id].protocol == 132 and by_id[sctp.id].remote_group_id == group.id

        neutron.network.delete_security_group_rule(ssh.id)
        await group_in_etcd(etcd, group.id, lambda g: ssh.id not in rule_ids(g), "rule deleted")
        neutron.network.update_security_group(group.id, stateful=False)
        await group_in_etcd(etcd, group.id, lambda g: not g.stateful, "stateless")
        neutron.network.delete_security_group(group.id)
        await absent(etcd, key, "group deleted")
        # A watch delivers in revision order, so once it has the delete it has every put.
        async with asyncio.timeout(10):
            while not (events and events[-1].kind == "delete"):
                await asyncio.sleep(0.02)
    # Every value the watch saw is a state Neutron went through, in Neutron's order (a batch
    # may skip states, never reorder them).
    expected = [
        (base, True),
        (base | {ssh.id}, True),
        (base | {ssh.id, ping6.id}, True),
        (base | added, True),
        (base | added - {ssh.id}, True),
        (base | added - {ssh.id}, False),
    ]
    seen = [
        expected.index((rule_ids(state), state.stateful))
        for event in events
        if event.kind == "put"
        for state in [parse_security_group(event.value, group.id).group]
    ]
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == len(expected) - 1, seen


async def test_default_group_and_members_of_a_new_project(
    neutron: Any, project_id: str, etcd: EtcdClient, groups: Callable[..., Any]
) -> None:
    network, _ = vxlan_network(neutron, project_id, "10.51.0.0/24")
    port = neutron.network.create_port(network_id=network.id, project_id=project_id)
    [default] = list(neutron.network.security_groups(project_id=project_id, name="default"))
    assert port.security_group_ids == [default.id]
    group = await group_in_etcd(etcd, default.id, lambda g: len(g.rules) == 4, "default group")
    ingress = [rule for rule in group.rules if rule.direction == "ingress"]
    assert {(r.ethertype, r.remote_group_id) for r in ingress} == {
        ("IPv4", default.id),
        ("IPv6", default.id),
    }
    member_key = keys.remote_group_member(default.id, port.id)
    member = await eventually(lambda: value_of(etcd, member_key), "member key of the port")
    address = port.fixed_ips[0]["ip_address"]
    assert parse_group_member(member, port.id).addresses == (f"{address}/32",)


async def test_membership_follows_port_groups_pairs_and_addresses(
    neutron: Any,
    project_id: str,
    etcd: EtcdClient,
    groups: Callable[..., Any],
    agents: Callable[[], ScriptedAgent],
) -> None:
    node = agents()
    await node.register()
    network, subnet = vxlan_network(neutron, project_id, "10.52.0.0/24")
    a, b, c = groups("pw-a"), groups("pw-b"), groups("pw-c")
    port = await bound_on(
        neutron, network, project_id, node.host, security_groups=[a.id, b.id],
        fixed_ips=[{"subnet_id": subnet.id, "ip_address": "10.52.0.10"}],
    )  # fmt: skip

    async def members(port_id: str) -> dict[str, tuple[str, ...]]:
        found = {}
        for sg in (a, b, c):
            raw = await value_of(etcd, keys.remote_group_member(sg.id, port_id))
            if raw is not None:
                found[sg.name] = parse_group_member(raw, port_id).addresses
        return found

    async def members_are(expected: dict[str, tuple[str, ...]]) -> bool:
        return await members(port.id) == expected

    await eventually(
        lambda: members_are({"pw-a": ("10.52.0.10/32",), "pw-b": ("10.52.0.10/32",)}),
        "member of a and b",
    )
    neutron.network.update_port(port.id, security_group_ids=[b.id, c.id])
    await eventually(
        lambda: members_are({"pw-b": ("10.52.0.10/32",), "pw-c": ("10.52.0.10/32",)}),
        "left a, joined c",
    )
    pairs = [{"ip_address": "10.52.0.200"}, {"ip_address": "192.0.2.7/24"}]
    neutron.network.update_port(port.id, allowed_address_pairs=pairs)
    with_pairs = ("10.52.0.10/32", "10.52.0.200/32", "192.0.2.0/24")
    await eventually(lambda: members_are({"pw-b": with_pairs, "pw-c": with_pairs}), "pairs")

    async def desired_pairs() -> Any:
        value = await node.desired(port.id)
        return value if value and value["allowed_address_pairs"] else None

    desired = await eventually(desired_pairs, "pairs in the desired port")
    assert desired["port_security_enabled"] is True
    assert desired["allowed_address_pairs"] == [
        {"ip_address": "10.52.0.200/32", "mac_address": port.mac_address},
        {"ip_address": "192.0.2.0/24", "mac_address": port.mac_address},
    ]
    neutron.network.update_port(
        port.id, fixed_ips=[{"subnet_id": subnet.id, "ip_address": "10.52.0.11"}]
    )
    moved = ("10.52.0.11/32", "10.52.0.200/32", "192.0.2.0/24")
    await eventually(lambda: members_are({"pw-b": moved, "pw-c": moved}), "new fixed IP")

    neutron.network.update_port(
        port.id, security_group_ids=[], allowed_address_pairs=[], port_security_enabled=False
    )
    await eventually(lambda: members_are({}), "no groups, no member keys")

    async def security_off() -> bool:
        value = await node.desired(port.id)
        return value is not None and value["port_security_enabled"] is False

    await eventually(security_off, "port security off in the desired port")
    other = await bound_on(neutron, network, project_id, node.host, security_groups=[a.id])
    await eventually(lambda: members(other.id), "second port is a member")
    neutron.network.delete_port(other.id)
    await eventually(lambda: _no_members(members, other.id), "member keys gone with the port")


async def _no_members(members: Callable[[str], Any], port_id: str) -> bool:
    return await members(port_id) == {}


async def test_address_group_and_a_rule_naming_it(
    neutron: Any, project_id: str, etcd: EtcdClient, groups: Callable[..., Any]
) -> None:
    ag = neutron.network.create_address_group(
        name="pw-ag", project_id=project_id, addresses=["10.9.0.0/16", "192.0.2.5/32"]
    )
    key = keys.address_group(ag.id)

    async def addresses_are(expected: tuple[str, ...]) -> bool:
        raw = await value_of(etcd, key)
        return raw is not None and parse_address_group(raw, ag.id).addresses == expected

    await eventually(lambda: addresses_are(("10.9.0.0/16", "192.0.2.5/32")), "address group")
    neutron.network.add_addresses_to_address_group(ag.id, ["2001:db8::/64"])
    await eventually(
        lambda: addresses_are(("10.9.0.0/16", "192.0.2.5/32", "2001:db8::/64")), "added"
    )
    neutron.network.remove_addresses_from_address_group(ag.id, ["10.9.0.0/16"])
    await eventually(lambda: addresses_are(("192.0.2.5/32", "2001:db8::/64")), "removed")
    group = groups()
    rule = neutron.network.create_security_group_rule(
        security_group_id=group.id, direction="ingress", ethertype="IPv4",
        remote_address_group_id=ag.id,
    )  # fmt: skip
    value = await group_in_etcd(etcd, group.id, lambda g: rule.id in rule_ids(g), "AG rule")
    [published] = [r for r in value.rules if r.rule_id == rule.id]
    assert published.remote_address_group_id == ag.id and published.remote_ip_prefix is None
    neutron.network.delete_security_group_rule(rule.id)
    neutron.network.delete_address_group(ag.id)
    await absent(etcd, key, "address group deleted")


async def test_deleting_a_remote_group_rejournals_groups_naming_it(
    neutron: Any, etcd: EtcdClient, groups: Callable[..., Any]
) -> None:
    """Neutron's database drops rules naming a deleted group without a callback."""
    target, referrer = groups("pw-target"), groups("pw-referrer")
    rule = neutron.network.create_security_group_rule(
        security_group_id=referrer.id, direction="ingress", ethertype="IPv4",
        remote_group_id=target.id,
    )  # fmt: skip
    await group_in_etcd(etcd, referrer.id, lambda g: rule.id in rule_ids(g), "rule naming it")
    neutron.network.delete_security_group(target.id)
    await absent(etcd, keys.secgroup(target.id), "target gone")
    await group_in_etcd(etcd, referrer.id, lambda g: rule.id not in rule_ids(g), "rule gone")


def _run_callback(url: str, sg_id: str, mode: str) -> int:
    argv = [sys.executable, "-m", "tests.ml2.rollback_proc", url, sg_id, mode]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return int(json.loads(done.stdout.strip().splitlines()[-1])["marked_in_transaction"])


async def test_a_rolled_back_transaction_journals_nothing(
    etcd: EtcdClient, groups: Callable[..., Any], journal: SqlJournal, stack: dict[str, Any]
) -> None:
    url = MariaDB(Path(stack["data_dir"])).url
    rolled, control = groups("pw-rolled"), groups("pw-control")
    for group in (rolled, control):
        await group_in_etcd(etcd, group.id, lambda g: len(g.rules) == 2, "groups forwarded")
    before = {g.id: (await etcd.get(keys.secgroup(g.id))).mod_revision for g in (rolled, control)}
    assert await asyncio.to_thread(_run_callback, url, rolled.id, "rollback") == 1
    assert await asyncio.to_thread(_run_callback, url, control.id, "commit") == 1
    await etcd.put(keys.KICK, b"")

    async def control_rewritten() -> bool:
        kv = await etcd.get(keys.secgroup(control.id))
        return kv is not None and kv.mod_revision > before[control.id]

    # The journal is replayed in order: once the later, committed row is in etcd, a row of the
    # rolled-back transaction would have been too.
    await eventually(control_rewritten, "the committed row forwarded")
    assert (await etcd.get(keys.secgroup(rolled.id))).mod_revision == before[rolled.id]
    assert journal.count() == 0 or all(
        row.key != keys.secgroup(rolled.id) for row in journal.fetch(1000)
    )


async def test_resync_on_a_new_forwarder_term_repairs_missing_and_stale_keys(
    neutron: Any, project_id: str, etcd: EtcdClient, groups: Callable[..., Any]
) -> None:
    network, _ = vxlan_network(neutron, project_id, "10.53.0.0/24")
    group = groups("pw-resync")
    port = neutron.network.create_port(
        network_id=network.id, project_id=project_id, security_groups=[group.id]
    )
    group_key, member_key = keys.secgroup(group.id), keys.remote_group_member(group.id, port.id)
    member = await eventually(lambda: value_of(etcd, member_key), "member key")
    original = await eventually(lambda: value_of(etcd, group_key), "group key")
    stale = [
        keys.secgroup(str(uuid.uuid4())),
        keys.remote_group_member(str(uuid.uuid4()), str(uuid.uuid4())),
        keys.address_group(str(uuid.uuid4())),
    ]
    for key in stale:
        await etcd.put(key, b'{"v": 1}')
    await etcd.delete(group_key)
    await etcd.put(member_key, b"garbage")
    # A new term: whoever wins the election key next resyncs. The row of the new group makes
    # the old leader's next fenced batch fail if it did not notice the loss by itself.
    await etcd.delete(keys.election("forwarder"))
    trigger = groups("pw-resync-trigger")

    async def repaired() -> bool:
        return (
            await value_of(etcd, group_key) == original
            and await value_of(etcd, member_key) == member
            and all([await etcd.get(key) is None for key in stale])
            and await etcd.get(keys.secgroup(trigger.id)) is not None
        )

    await eventually(repaired, "policy keys resynced")

    written = (await etcd.get(keys.secgroup(trigger.id))).mod_revision

    async def reported() -> bool:
        kv = await etcd.get(keys.status("ml2"))
        return kv is not None and parse_ml2_report(kv.value).policy_revision >= written

    await eventually(reported, "policy revision in the ml2 report")


async def test_a_bulk_of_300_rules_is_one_journal_row_and_one_large_value(
    neutron: Any, etcd: EtcdClient, groups: Callable[..., Any]
) -> None:
    """Past TEXT's 64 KiB (MEDIUMTEXT journal values), journaled once per transaction."""
    group = groups("pw-large")
    await group_in_etcd(etcd, group.id, lambda g: len(g.rules) == 2, "new group")
    key = keys.secgroup(group.id)
    async with recording(etcd, key) as events:
        body = [
            {
                "security_group_id": group.id,
                "direction": "ingress",
                "ethertype": "IPv4",
                "protocol": "udp",
                "port_range_min": 2000 + index,
                "port_range_max": 2000 + index,
                "remote_ip_prefix": f"10.{index % 250}.0.0/16",
            }
            for index in range(300)
        ]
        created = await asyncio.to_thread(
            lambda: list(neutron.network.create_security_group_rules(body))
        )
        value = await group_in_etcd(etcd, group.id, lambda g: len(g.rules) == 302, "300 rules")
        async with asyncio.timeout(10):  # until the watch, too, has the value etcd holds
            while not any(_rule_count(event) == 302 for event in events):
                await asyncio.sleep(0.02)
    assert rule_ids(value) >= {rule.id for rule in created}
    assert len((await etcd.get(key)).value) > 65536
    # The whole request is one transaction: one value, not 300 growing ones.
    assert len([event for event in events if event.kind == "put"]) == 2, events  # listing + 1
