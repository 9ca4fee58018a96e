"""The reconciler's order with the ports (pure, on a scripted Neutron): the ports follow a
pass before any group is deleted, pooled ports are cleared of a group about to go, and a
group Neutron keeps because ports still carry it is tried again without any change."""

from __future__ import annotations

import asyncio

from podwire.k8s.compile import Cluster
from podwire.k8s.groups import OPEN_EGRESS, OPEN_INGRESS
from podwire.kubeside.netpol_sync import NetpolReconciler
from podwire.kubeside.policy_view import PolicyView
from podwire.neutron.client import NeutronInUse
from podwire.neutron.netpol import ObservedAddressGroup, ObservedGroup
from tests.k8s.test_plan import observed_rule

GONE = "podwire-np-of-a-deleted-policy"


class Scripted:
    """The open groups as they should be, and a deleted policy's group that Neutron keeps
    while ports carry it (the first ``refusals`` deletes)."""

    def __init__(self, refusals: int, calls: list[str]) -> None:
        self.refusals = refusals
        self.calls = calls
        self.deleted = False

    def address_groups(self) -> list[ObservedAddressGroup]:
        return []

    def groups(self) -> list[ObservedGroup]:
        groups = [
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
        return groups if self.deleted else [*groups, ObservedGroup("gone-id", GONE, ())]

    def delete_group(self, group_id: str) -> None:
        self.calls.append(f"delete {group_id}")
        if self.refusals:
            self.refusals -= 1
            raise NeutronInUse("security group in use", 409)
        self.deleted = True


class Ports:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.views: list[PolicyView] = []

    async def follow(self, view: PolicyView) -> int:
        self.calls.append("follow")
        self.views.append(view)
        return 0

    async def clear_group(self, group_id: str) -> int:
        self.calls.append(f"clear {group_id}")
        return 0


async def test_ports_follow_before_a_group_is_deleted() -> None:
    calls: list[str] = []
    ports = Ports(calls)
    reconciler = NetpolReconciler(
        lambda: Cluster({}, {}, {}),
        Scripted(0, calls),  # type: ignore[arg-type]
        ports=ports,
    )
    steps = await reconciler.sync()
    assert list(steps.delete_groups) == ["gone-id"]
    assert calls == ["follow", "clear gone-id", "delete gone-id"]
    # The pass's view: every marked group, the one about to go too (a port's set is
    # recomputed from them), and the ids by name.
    assert ports.views[0].marked == {OPEN_INGRESS, OPEN_EGRESS, "gone-id"}
    assert reconciler.lingering == frozenset()
    assert GONE not in reconciler.group_ids


async def test_a_group_still_carried_is_tried_again_without_a_change() -> None:
    calls: list[str] = []
    objects = Scripted(2, calls)
    reconciler = NetpolReconciler(lambda: Cluster({}, {}, {}), objects, ports=Ports(calls))  # type: ignore[arg-type]
    changed = asyncio.Event()
    changed.set()
    task = asyncio.create_task(reconciler.run(changed))
    try:
        async with asyncio.timeout(10):  # 1 s, then 2 s: the lingering backoff
            while not objects.deleted:
                await asyncio.sleep(0.01)
            while reconciler.lingering:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert calls.count("delete gone-id") == 3
    assert reconciler.problem is None
