"""The policy values without Neutron: Neutron-shaped rows in, the schema's readers out.

Properties (hypothesis): every rule Neutron can store is published in a form the agent's
reader accepts unchanged; whatever bytes sit under a policy key, the readers return a value
or raise ``ValidationError``; membership changes take the old member keys exactly to the new
ones; a resync's ops take etcd exactly to the snapshot.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podwire import keys
from podwire.errors import ValidationError
from podwire.ml2 import policy
from podwire.ml2.forwarder import within_bytes
from podwire.ml2.journal import Entry
from podwire.ml2.policy_resync import resync_ops
from podwire.schema.ports import DesiredPort, parse_desired_port
from podwire.schema.secgroups import (
    PROTOCOL_NUMBERS,
    parse_address_group,
    parse_group_member,
    parse_security_group,
)


def examples(full: int) -> int:
    return max(10, full // 10) if os.environ.get("PODWIRE_QUICK") else full


uuids = st.uuids().map(str)
PORT = "0f3c5a8e-9a5e-4d0b-9c1e-2b7f0c4d5e6f"
GROUP = "1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d"
ipv4 = st.integers(0, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
ipv6 = st.integers(0, 2**128 - 1).map(lambda n: str(ipaddress.IPv6Address(n)))


@st.composite
def neutron_rules(draw: st.DrawFn) -> dict[str, Any]:
    """A rule as Neutron's API accepts and stores it (names, numbers as strings, ICMP type and
    code in the port fields, a prefix with host bits as typed)."""
    ethertype = draw(st.sampled_from(["IPv4", "IPv6"]))
    protocol = draw(
        st.sampled_from([None, "tcp", "udp", "icmp", "sctp", "6", "17", "132", "47", "vrrp"])
        | st.integers(0, 255).map(str)
    )
    number = policy_protocol(protocol)
    low = high = None
    if number in (6, 17, 132, 33, 136) and draw(st.booleans()):
        low = draw(st.integers(1, 65535))
        high = draw(st.integers(low, 65535))
    elif number in (1, 58) and draw(st.booleans()):
        low = draw(st.integers(0, 255))
        high = draw(st.none() | st.integers(0, 255))
    if number == 58 and ethertype == "IPv4":
        ethertype = "IPv6"
    remote = draw(st.sampled_from(["none", "prefix", "group", "address_group"]))
    address = draw(ipv4 if ethertype == "IPv4" else ipv6)
    length = draw(st.integers(0, 32 if ethertype == "IPv4" else 128))
    return {
        "id": draw(uuids),
        "direction": draw(st.sampled_from(["ingress", "egress"])),
        "ethertype": ethertype,
        "protocol": protocol,
        "port_range_min": low,
        "port_range_max": high,
        "remote_ip_prefix": f"{address}/{length}" if remote == "prefix" else None,
        "remote_group_id": draw(uuids) if remote == "group" else None,
        "remote_address_group_id": draw(uuids) if remote == "address_group" else None,
    }


def policy_protocol(value: str | None) -> int | None:
    if value is None:
        return None
    return int(value) if value.isdigit() else PROTOCOL_NUMBERS[value]


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(neutron_rules(), max_size=12), uuids, st.booleans(), st.integers(0, 10**6))
def test_every_neutron_rule_is_published_in_a_form_the_reader_keeps(
    rules: list[dict[str, Any]], sg_id: str, stateful: bool, revision: int
) -> None:
    group = policy.GroupRow(sg_id, "p1", stateful, revision)
    value = policy.group_value(group, rules)
    parsed = parse_security_group(value, sg_id)
    assert parsed.problems == ()
    assert {rule.rule_id for rule in parsed.group.rules} == {rule["id"] for rule in rules}
    assert (parsed.group.stateful, parsed.group.revision) == (stateful, revision)
    # Publishing is deterministic whatever order the database returns rows in.
    assert policy.group_value(group, list(reversed(rules))) == value
    ordered = sorted(rules, key=lambda r: r["id"])
    for published, row in zip(
        sorted(parsed.group.rules, key=lambda r: r.rule_id), ordered, strict=True
    ):
        expected = policy_protocol(row["protocol"])
        if expected == 1 and row["ethertype"] == "IPv6":
            expected = 58
        assert published.protocol == expected
        if row["remote_ip_prefix"]:
            network = ipaddress.ip_network(row["remote_ip_prefix"], strict=False)
            assert published.remote_ip_prefix == str(network)


def test_a_rule_the_schema_refuses_is_still_published_as_neutron_stores_it() -> None:
    odd = {
        "id": "5b0c0c9e-2f57-4d5a-8f0e-0b8a8f0e0b8a", "direction": "ingress",
        "ethertype": "IPv4", "protocol": "gre", "port_range_min": 10, "port_range_max": 20,
        "remote_ip_prefix": None, "remote_group_id": None, "remote_address_group_id": None,
    }  # fmt: skip
    value = policy.group_value(policy.GroupRow(GROUP, None, True, 3), [odd])
    assert json.loads(value)["rules"] == [odd]
    parsed = parse_security_group(value, GROUP)
    assert parsed.group.rules == () and "protocol 47 has no ports" in parsed.problems[0]


@settings(max_examples=examples(300), deadline=None)
@given(
    st.binary(max_size=300)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=12),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids),
        max_leaves=25,
    ).map(lambda v: json.dumps(v).encode())
)
def test_policy_readers_never_fail_with_anything_but_validation_errors(raw: bytes) -> None:
    for read in (parse_security_group, parse_group_member, parse_address_group):
        with contextlib.suppress(ValidationError):
            read(raw)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.sampled_from([f"sg{i}" for i in range(5)]), max_size=5),
    st.lists(st.sampled_from([f"sg{i}" for i in range(5)]), max_size=5),
    st.lists(ipv4, max_size=3),
    st.lists(ipv4, max_size=3),
)
def test_membership_changes_take_the_old_keys_to_the_new(
    before_groups: list[str], after_groups: list[str], before_ips: list[str], after_ips: list[str]
) -> None:
    def port(groups: list[str], ips: list[str]) -> dict[str, Any]:
        fixed = [{"ip_address": ip} for ip in ips]
        return {"id": PORT, "security_groups": groups, "fixed_ips": fixed}

    before = policy.port_membership(port(before_groups, before_ips))
    after = policy.port_membership(port(after_groups, after_ips))
    assert before is not None and after is not None
    store = dict(before.puts())
    changes = policy.membership_changes(before, after)
    for key, value in changes:
        if value is None:
            del store[key]
        else:
            store[key] = value
    assert store == after.puts()
    assert len({key for key, _ in changes}) == len(changes)
    for key, value in store.items():
        assert parse_group_member(value, PORT).addresses == policy.member_addresses(after_ips, [])
        assert key.startswith(keys.remote_groups_prefix())
    if before.puts() == after.puts():
        assert changes == []  # a status-only update journals nothing


def test_member_addresses_are_canonical_and_include_address_pairs() -> None:
    addresses = policy.member_addresses(
        ["10.0.0.5", "2001:db8::1", "10.0.0.5"], ["10.0.0.77/24", "192.0.2.9"]
    )
    assert addresses == ("10.0.0.0/24", "10.0.0.5/32", "192.0.2.9/32", "2001:db8::1/128")


def test_desired_port_carries_port_security_and_pairs() -> None:
    port = {
        "mac_address": "FA:16:3E:00:00:01",
        "allowed_address_pairs": [
            {"ip_address": "10.0.0.9"},
            {"ip_address": "10.0.1.7/24", "mac_address": "fa:16:3e:00:00:02"},
        ],
    }
    pairs = policy.address_pairs(port)
    assert [(p.ip_address, p.mac_address) for p in pairs] == [
        ("10.0.0.9/32", "fa:16:3e:00:00:01"),
        ("10.0.1.0/24", "fa:16:3e:00:00:02"),
    ]
    value = DesiredPort(
        port_id=PORT, network_id=GROUP, mac_address="fa:16:3e:00:00:01", mtu=1450,
        network_type="vxlan", physnet=None, segmentation_id=7, vif_type="veth",
        fixed_ips=(), security_groups=(), device_owner="", device_id="",
        port_security_enabled=False, allowed_address_pairs=pairs,
    )  # fmt: skip
    assert parse_desired_port(value.encode(), PORT) == value


@settings(max_examples=examples(200), deadline=None)
@given(
    st.dictionaries(st.sampled_from([f"/podwire/global/secgroups/g{i}" for i in range(8)]),
                    st.sampled_from(["a", "b"])),
    st.dictionaries(st.sampled_from([f"/podwire/global/secgroups/g{i}" for i in range(8)]),
                    st.sampled_from([b"a", b"b", b"x"])),
)  # fmt: skip
def test_resync_ops_take_etcd_to_the_snapshot(
    wanted: dict[str, str], present: dict[str, bytes]
) -> None:
    ops, puts, deletes = resync_ops(wanted, present)
    assert len(ops) == puts + deletes
    assert deletes == len(set(present) - set(wanted))
    assert puts == sum(1 for key, value in wanted.items() if present.get(key) != value.encode())
    if {key: value.encode() for key, value in wanted.items()} == present:
        assert ops == []


def test_a_batch_of_large_values_is_cut_to_fit_one_etcd_request() -> None:
    big = "x" * 400_000
    rows = [Entry(index, f"/podwire/global/secgroups/g{index}", big) for index in range(6)]
    first = within_bytes(rows, 1024 * 1024)
    assert [row.id for row in first] == [0, 1]
    assert within_bytes(rows[:1], 10) == rows[:1]  # one oversized row still goes, alone
    small = [Entry(index, f"/k{index}", "v") for index in range(5)]
    assert within_bytes(small, 1024) == small
