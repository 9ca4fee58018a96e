"""The enforcer's second rendering (#38), against a real etcd and real nftables: a memif port's
classifier is compiled in the pass that puts its nftables rules in force, and the pass counts
as in force only once the classifier is installed (what the master's confirmation gives)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from podwire import keys
from podwire.agent.policy.enforcer import EnforcerSettings, PolicyEnforcer
from podwire.etcd import EtcdClient
from podwire.netfilter import Nftables
from podwire.schema.ports import AddressPair, DesiredPort
from podwire.schema.secgroups import Rule, SecurityGroup
from podwire.sgpolicy.classifier import UNFILTERED, Classifier, RuleKind, decode
from tests.agent.netenv import NetEnv
from tests.agent.sgnet import numbered_ports, wait_applied
from tests.etcd_tools import delete_prefix

MEMIF_TAP = "pwt0123456789ab"


class Recording:
    """``MasterFilters`` that records what it is given; ``hold`` keeps installs waiting, as a
    master that has not answered yet."""

    def __init__(self) -> None:
        self.installed: list[tuple[str, Classifier | None, str]] = []
        self.hold = asyncio.Event()
        self.hold.set()

    def filtered_here(self, ifname: str) -> bool:
        return ifname.startswith("pwt")

    async def install(self, ifname: str, blob: bytes | None, why: str) -> None:
        await self.hold.wait()
        self.installed.append((ifname, None if blob is None else decode(blob), why))

    def last(self) -> Classifier | None:
        return self.installed[-1][1]


@pytest.fixture
async def group(etcd: EtcdClient) -> AsyncIterator[SecurityGroup]:
    found = SecurityGroup(str(uuid.uuid4()), (Rule(str(uuid.uuid4()), "egress", "IPv4"),))
    await etcd.put(keys.secgroup(found.sg_id), found.encode().encode())
    yield found
    await etcd.delete(keys.secgroup(found.sg_id))


@pytest.fixture
async def enforcer(
    etcd: EtcdClient, netenv: NetEnv
) -> AsyncIterator[tuple[PolicyEnforcer, Recording]]:
    host = f"{netenv.tag}-sgc"
    nft = Nftables(netenv.namespace("sgc"))
    found = PolicyEnforcer(etcd, nft, EnforcerSettings(host), None)
    recording = Recording()
    found.filters = recording
    task = asyncio.create_task(found.run())
    found.adopt([])
    await asyncio.wait_for(found.synced.wait(), 30)
    yield found, recording
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    nft.close()
    await delete_prefix(etcd, keys.state_node_prefix(host))


def _ports(group: SecurityGroup) -> tuple[DesiredPort, DesiredPort]:
    """A memif port and a veth port, both in ``group``."""
    (memif, _), (veth, _) = numbered_ports(2, (group.sg_id,))
    return memif, veth


async def test_a_memif_port_gets_its_classifier_in_the_pass_of_its_rules(
    etcd: EtcdClient, enforcer: tuple[PolicyEnforcer, Recording], group: SecurityGroup
) -> None:
    found, recording = enforcer
    memif, veth = _ports(group)
    await found.enforce(veth, "pwp0123456789ab", 10)
    assert recording.installed == []  # a veth's frames never bypass the kernel
    await found.enforce(memif, MEMIF_TAP, 10)
    classifier = recording.last()
    assert recording.installed[-1][0] == MEMIF_TAP and classifier is not None
    assert classifier.filtered and classifier.stateful
    assert classifier.macs == (memif.mac_address,) and classifier.ingress == ()

    # A rule added: the pass that puts it in force waits for the classifier's install.
    recording.hold.clear()
    rule = Rule(str(uuid.uuid4()), "ingress", "IPv4", 17, 9, 9, "10.9.0.0/24")
    changed = dataclasses.replace(group, rules=(*group.rules, rule))
    revision = await etcd.put(keys.secgroup(group.sg_id), changed.encode().encode())
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(wait_applied(found, revision), 0.5)
    recording.hold.set()
    await asyncio.wait_for(wait_applied(found, revision), 10)
    classifier = recording.last()
    assert classifier is not None
    assert [(r.kind, r.first, r.second) for r in classifier.ingress] == [
        (RuleKind.PORTS, (17, 17), (9, 9))
    ]

    # Port security off: the master is told to stop classifying.
    found.port_changed(memif.port_id, dataclasses.replace(memif, port_security_enabled=False))
    await _until(lambda: recording.last() == UNFILTERED)


async def test_a_classifier_over_a_limit_keeps_the_port_in_the_kernel(
    enforcer: tuple[PolicyEnforcer, Recording], group: SecurityGroup
) -> None:
    found, recording = enforcer
    memif, _ = _ports(group)
    pairs = tuple(AddressPair(f"10.9.200.{i}/32", f"fa:16:3e:aa:00:{i:02x}") for i in range(1, 40))
    await found.enforce(dataclasses.replace(memif, allowed_address_pairs=pairs), MEMIF_TAP, 10)
    ifname, classifier, why = recording.installed[-1]
    assert ifname == MEMIF_TAP and classifier is None and "MAX_MACS" in why


async def _until(check: Callable[[], bool], within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not check():
            await asyncio.sleep(0.02)
