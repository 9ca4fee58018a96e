"""The NetworkPolicy reconciler against the session's real Neutron: compiled policies become
marked security groups, rules and address groups; changes converge in one pass; a second
pass changes nothing; objects without podwire's mark are never touched."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from podwire.k8s.compile import Cluster, compile_policies
from podwire.k8s.groups import GROUP_PREFIX, OPEN_EGRESS, OPEN_INGRESS, group_name
from podwire.k8s.plan import plan
from podwire.kubeside import netpol_sync
from podwire.kubeside.netpol_sync import NetpolReconciler
from podwire.neutron.netpol import NetpolObjects
from tests.k8s.objects import cluster, key, namespace, pod, policy

pytestmark = pytest.mark.stack

PREFIX = "podwire-"


class Snapshot:
    """The cluster the reconciler reads, changed by the test between passes."""

    def __init__(self, value: Cluster) -> None:
        self.value = value

    def __call__(self) -> Cluster:
        return self.value


def allow_web_from_blue(port: int) -> Any:
    return policy(
        "a",
        "web",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
                {
                    "from": [
                        {"namespaceSelector": {"matchLabels": {"team": "blue"}}},
                        {"ipBlock": {"cidr": "192.0.2.0/24", "except": ["192.0.2.0/25"]}},
                    ],
                    "ports": [{"port": port}],
                }
            ],
        },
    )


NAMESPACES = [namespace("a", team="blue"), namespace("b")]
PODS = [pod("a", "web", ["10.9.0.1"], {"app": "web"}), pod("b", "x", ["10.9.1.1"], {"app": "x"})]


async def test_policies_converge_in_neutron_and_only_marked_objects_go(neutron: Any) -> None:
    project = uuid.uuid4().hex
    tag = f"podwire-test-{project[:8]}"
    objects = NetpolObjects(neutron, project, tag, PREFIX)
    net = neutron.network
    foreign_group = net.create_security_group(name=f"{GROUP_PREFIX}foreign", project_id=project)
    foreign_ag = net.create_address_group(
        name="podwire-ag-foreign", description="not ours", addresses=[], project_id=project
    )
    snapshot = Snapshot(cluster(NAMESPACES, PODS, [allow_web_from_blue(80)]))
    reconciler = NetpolReconciler(snapshot, objects)
    try:
        first = await reconciler.sync()
        assert len(first.create_groups) == 3  # the policy's and the two open groups
        groups = {group.name: group for group in objects.groups()}
        assert set(groups) == {OPEN_INGRESS, OPEN_EGRESS, group_name(key("a", "web"))}
        (address_group,) = objects.address_groups()
        assert address_group.addresses == {"10.9.0.1/32"}
        rules = groups[group_name(key("a", "web"))].rules
        assert {(r.remote_ip_prefix, r.port_min) for r in rules if r.remote_ip_prefix} == {
            ("192.0.2.128/25", 80)
        }
        assert {r.remote_address_group_id for r in rules} == {None, address_group.id}
        assert len(rules) == 3  # IPv4 + IPv6 to the address group, one prefix; no defaults
        assert len(groups[OPEN_EGRESS].rules) == 2

        assert (await reconciler.sync()).empty

        moved = [*PODS, pod("b", "y", ["10.9.1.2"], {"app": "y"})]
        snapshot.value = cluster(
            [NAMESPACES[0], namespace("b", team="blue")], moved, [allow_web_from_blue(8080)]
        )
        second = await reconciler.sync()
        assert len(second.change_addresses) == 1 and not second.create_groups
        (address_group,) = objects.address_groups()
        assert address_group.addresses == {"10.9.0.1/32", "10.9.1.1/32", "10.9.1.2/32"}
        rules = {g.name: g for g in objects.groups()}[group_name(key("a", "web"))].rules
        assert {r.port_min for r in rules} == {8080}
        assert plan(compile_policies(snapshot()), objects.groups(), objects.address_groups()).empty

        snapshot.value = cluster(NAMESPACES, PODS, [])
        await reconciler.sync()
        assert {g.name for g in objects.groups()} == {OPEN_INGRESS, OPEN_EGRESS}
        assert objects.address_groups() == []
        assert net.get_security_group(foreign_group.id).name == f"{GROUP_PREFIX}foreign"
        assert net.get_address_group(foreign_ag.id).name == "podwire-ag-foreign"
    finally:
        for group in objects.groups():
            objects.delete_group(group.id)
        for address_group in objects.address_groups():
            objects.delete_address_group(address_group.id)
        net.delete_security_group(foreign_group, ignore_missing=True)
        net.delete_address_group(foreign_ag, ignore_missing=True)


class CountedReads(NetpolObjects):
    """Counts the passes' reads of Neutron."""

    reads = 0

    def groups(self) -> Any:
        self.reads += 1
        return super().groups()


async def test_a_pass_that_moved_only_addresses_reads_nothing_and_drift_is_repaired(
    neutron: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod coming or going costs its address-group update alone; an address removed by
    hand is put back by the first pass whose reading has grown too old (it reads again)."""
    project = uuid.uuid4().hex
    objects = CountedReads(neutron, project, f"podwire-test-{project[:8]}", PREFIX)
    pods = [pod("b", "x", ["10.9.1.1"], {"app": "x"})]
    snapshot = Snapshot(cluster(NAMESPACES, [*PODS[:1], *pods], [allow_web_from_blue(80)]))
    reconciler = NetpolReconciler(snapshot, objects)
    try:
        await reconciler.sync()
        assert (await reconciler.sync()).empty  # reads, changes nothing: trusted from now
        reads = objects.reads
        for index in range(2, 5):
            pods.append(pod("a", f"p{index}", [f"10.9.0.{index}"], {"app": "y"}))
            snapshot.value = cluster(NAMESPACES, [*PODS[:1], *pods], [allow_web_from_blue(80)])
            assert len((await reconciler.sync()).change_addresses) == 1
        assert objects.reads == reads
        (address_group,) = objects.address_groups()
        assert address_group.addresses == {f"10.9.0.{i}/32" for i in range(1, 5)}

        neutron.network.remove_addresses_from_address_group(address_group.id, ["10.9.0.2/32"])
        pods.append(pod("a", "p5", ["10.9.0.5"], {"app": "y"}))
        snapshot.value = cluster(NAMESPACES, [*PODS[:1], *pods], [allow_web_from_blue(80)])
        monkeypatch.setattr(netpol_sync, "OBSERVED_MAX_AGE", 0.0)  # the reading is too old
        repaired = await reconciler.sync()
        assert objects.reads == reads + 1
        assert repaired.change_addresses[0].add == {"10.9.0.2/32", "10.9.0.5/32"}
        (address_group,) = objects.address_groups()
        assert address_group.addresses == {f"10.9.0.{i}/32" for i in range(1, 6)}
    finally:
        for group in objects.groups():
            objects.delete_group(group.id)
        for address_group in objects.address_groups():
            objects.delete_address_group(address_group.id)
