"""The plan: the difference between compiled groups and what Neutron holds, pure."""

from __future__ import annotations

import asyncio

from podwire.backoff import Backoff
from podwire.k8s.compile import Cluster
from podwire.k8s.groups import (
    OPEN_EGRESS,
    OPEN_INGRESS,
    DesiredAddressGroup,
    DesiredGroup,
    DesiredPolicy,
    SgRule,
)
from podwire.k8s.plan import plan
from podwire.kubeside.netpol_sync import NetpolReconciler
from podwire.neutron.client import NeutronRequestError
from podwire.neutron.netpol import ObservedAddressGroup, ObservedGroup, ObservedRule


def observed_rule(rule_id: str, **fields: object) -> ObservedRule:
    base: dict[str, object] = {
        "direction": "ingress",
        "ethertype": "IPv4",
        "protocol": None,
        "port_min": None,
        "port_max": None,
        "remote_ip_prefix": None,
        "remote_address_group_id": None,
        "remote_group_id": None,
    }
    return ObservedRule(rule_id, **{**base, **fields})  # type: ignore[arg-type]


def desired(*rules: SgRule, addresses: frozenset[str] = frozenset()) -> DesiredPolicy:
    group = DesiredGroup("podwire-np-x", "x", frozenset(rules))
    ag = DesiredAddressGroup("podwire-ag-y", "y", addresses)
    return DesiredPolicy(groups={group.name: group}, address_groups={ag.name: ag})


def test_foreign_twin_and_stale_rules_go_and_missing_ones_come() -> None:
    wanted = SgRule("ingress", "IPv4", "tcp", 80, 80, remote_address_group="podwire-ag-y")
    current = ObservedGroup(
        "g1",
        "podwire-np-x",
        (
            observed_rule(
                "keep", protocol="tcp", port_min=80, port_max=80, remote_address_group_id="ag1"
            ),
            observed_rule(
                "twin", protocol="tcp", port_min=80, port_max=80, remote_address_group_id="ag1"
            ),
            observed_rule("remote-group", remote_group_id="g9"),
            observed_rule("unknown-ag", remote_address_group_id="ag9"),
            observed_rule("stale", protocol="udp"),
        ),
    )
    extra = SgRule("egress", "IPv6")
    steps = plan(
        desired(wanted, extra),
        [current],
        [ObservedAddressGroup("ag1", "podwire-ag-y", frozenset())],
    )
    assert sorted(steps.delete_rules) == ["remote-group", "stale", "twin", "unknown-ag"]
    assert steps.add_rules == [("g1", extra)]
    assert not steps.create_groups and not steps.create_address_groups


def test_a_whole_family_prefix_is_the_same_as_no_remote() -> None:
    current = ObservedGroup(
        "g1", "podwire-np-x", (observed_rule("r", remote_ip_prefix="0.0.0.0/0"),)
    )
    assert plan(
        desired(SgRule("ingress", "IPv4")),
        [current],
        [ObservedAddressGroup("ag1", "podwire-ag-y", frozenset())],
    ).empty


def test_addresses_change_by_difference_and_unwanted_objects_go() -> None:
    old_group = ObservedGroup("g2", "podwire-np-old", ())
    steps = plan(
        desired(addresses=frozenset({"10.0.0.1/32", "10.0.0.2/32"})),
        [old_group],
        [
            ObservedAddressGroup("ag1", "podwire-ag-y", frozenset({"10.0.0.2/32", "10.0.0.3/32"})),
            ObservedAddressGroup("ag2", "podwire-ag-old", frozenset()),
        ],
    )
    (change,) = steps.change_addresses
    assert (change.group_id, change.add, change.remove) == ("ag1", {"10.0.0.1/32"}, {"10.0.0.3/32"})
    assert [g.name for g in steps.create_groups] == ["podwire-np-x"]
    assert steps.delete_groups == ["g2"] and steps.delete_address_groups == ["ag2"]
    assert OPEN_EGRESS not in {g.name for g in steps.create_groups}


async def test_the_reconciler_outlives_a_refused_pass_and_repeats_it() -> None:
    class Refusing:
        calls = 0

        def address_groups(self) -> list[ObservedAddressGroup]:
            self.calls += 1
            if self.calls == 1:
                raise NeutronRequestError("quota exceeded", 403)
            return []

        def groups(self) -> list[ObservedGroup]:
            """The two open groups as they should be: the second pass has nothing to do."""
            return [
                ObservedGroup(
                    name,
                    name,
                    tuple(
                        observed_rule(f"{name}-{family}", direction=direction, ethertype=family)
                        for family in ("IPv4", "IPv6")
                    ),
                )
                for name, direction in ((OPEN_INGRESS, "ingress"), (OPEN_EGRESS, "egress"))
            ]

    objects = Refusing()
    empty = Cluster({}, {}, {})
    reconciler = NetpolReconciler(lambda: empty, objects, Backoff(0.001, 0.002))  # type: ignore[arg-type]
    changed = asyncio.Event()
    changed.set()
    task = asyncio.create_task(reconciler.run(changed))
    async with asyncio.timeout(5):
        while objects.calls < 2 or changed.is_set():
            await asyncio.sleep(0.001)
    assert not task.done()
    task.cancel()
    assert objects.calls == 2
