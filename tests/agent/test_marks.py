"""The agent deletes only links it marked (alias ``naming.MARK``): a foreign bridge or veth
named like ours survives; plumbing of an agent from before marks is adopted when a desired
port needs it (its VXLAN device stops learning in place), and a pre-mark pod veth is
recognised by its derived MAC."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from podwire import keys
from podwire.agent import naming
from podwire.agent.fabric.binder import Binder, BinderSettings
from podwire.agent.ports.veth import host_mac
from podwire.etcd import EtcdClient
from podwire.netlink import HostNetlink
from tests.agent.desired_keys import desired_value
from tests.agent.harness import HostAgent, acni
from tests.agent.netenv import NetEnv, in_ns, links_in
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack

IP = [{"ip_address": "10.1.0.5", "subnet_id": "s", "cidr": "10.1.0.0/24", "gateway_ip": None}]


@contextlib.asynccontextmanager
async def binder_in(etcd: EtcdClient, ns: str, host: str, vtep: str) -> AsyncIterator[Binder]:
    """A binder that has listed, bound what is desired and reconciled leftovers once."""
    nl = HostNetlink(ns)
    binder = Binder(etcd, nl, BinderSettings(host, vtep, {}, vlan_capable=False))
    task = asyncio.create_task(binder.run())
    try:
        await asyncio.wait_for(binder.synced.wait(), 10)
        yield binder
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        nl.close()


def alias(ns: str, name: str) -> str:
    out = in_ns(ns, "ip", "-d", "link", "show", name).stdout
    found = [line.split("alias ", 1)[1] for line in out.splitlines() if "alias " in line]
    return found[0].strip() if found else ""


def ifindex(ns: str, name: str) -> str:
    return in_ns(ns, "cat", f"/sys/class/net/{name}/ifindex").stdout.strip()


async def test_foreign_bridge_named_like_ours_survives_reconcile(
    etcd: EtcdClient, netenv: NetEnv, hostnames: list[str]
) -> None:
    ns, vtep = netenv.host(1)
    foreign, leftover = naming.bridge(str(uuid.uuid4())), str(uuid.uuid4())
    in_ns(ns, "ip", "link", "add", foreign, "type", "bridge")
    vxlan = ("type", "vxlan", "dstport", "4789", "id")
    in_ns(ns, "ip", "link", "add", naming.vxlan(foreign[4:]), *vxlan, "71")
    in_ns(ns, "ip", "link", "add", naming.bridge(leftover), "type", "bridge")
    in_ns(ns, "ip", "link", "add", naming.vxlan(leftover), *vxlan, "72")
    for name in (naming.bridge(leftover), naming.vxlan(leftover)):
        in_ns(ns, "ip", "link", "set", name, "alias", naming.MARK)  # ours, from a past run
    async with binder_in(etcd, ns, hostnames[0], vtep):
        present = links_in(ns)
    assert foreign in present and naming.vxlan(foreign[4:]) in present
    assert naming.bridge(leftover) not in present and naming.vxlan(leftover) not in present


async def test_plumbing_from_before_marks_is_adopted_then_removed(
    etcd: EtcdClient, netenv: NetEnv, hostnames: list[str]
) -> None:
    ns, vtep = netenv.host(1)
    host, port, net = hostnames[0], str(uuid.uuid4()), str(uuid.uuid4())
    bridge, vxlan = naming.bridge(net), naming.vxlan(net)
    in_ns(ns, "ip", "link", "add", bridge, "type", "bridge")
    in_ns(ns, "ip", "link", "add", vxlan, "type", "vxlan", "id", "4343", "local", vtep,
          "dstport", "4789")  # fmt: skip
    before = ifindex(ns, bridge), ifindex(ns, vxlan)
    value = desired_value(port, net, "fa:16:3e:00:00:09", IP, segmentation_id=4343)
    await etcd.put(keys.node_port(host, port), value)
    try:
        async with binder_in(etcd, ns, host, vtep) as binder:
            await binder.wait_wired(port, 10)
            assert (ifindex(ns, bridge), ifindex(ns, vxlan)) == before  # adopted, not replaced
            assert alias(ns, bridge) == alias(ns, vxlan) == naming.MARK
            details = in_ns(ns, "ip", "-d", "link", "show", vxlan).stdout
            assert "nolearning" in details  # learning switched off in place
            await etcd.delete(keys.node_port(host, port))
            await eventually(lambda: _gone(ns, bridge), "adopted bridge removed")
            assert vxlan not in links_in(ns)
    finally:
        await etcd.delete(keys.node_port(host, port))


async def test_foreign_vxlan_with_other_settings_is_not_replaced(
    etcd: EtcdClient, netenv: NetEnv, hostnames: list[str]
) -> None:
    ns, vtep = netenv.host(1)
    host, port, net = hostnames[0], str(uuid.uuid4()), str(uuid.uuid4())
    in_ns(
        ns, "ip", "link", "add", naming.vxlan(net), "type", "vxlan", "id", "77", "dstport", "4789"
    )
    before = ifindex(ns, naming.vxlan(net))
    value = desired_value(port, net, "fa:16:3e:00:00:0a", IP, segmentation_id=4344)
    await etcd.put(keys.node_port(host, port), value)
    try:
        async with binder_in(etcd, ns, host, vtep) as binder:
            with pytest.raises(Exception, match="not podwire's"):
                await binder.wait_wired(port, 10)
        assert ifindex(ns, naming.vxlan(net)) == before
    finally:
        await etcd.delete(keys.node_port(host, port))


async def test_del_leaves_a_foreign_veth_and_removes_a_pre_mark_one(
    agents: list[HostAgent], vxnet: Any, plugin: Path
) -> None:
    agent = agents[0]
    foreign_cid, old_cid = uuid.uuid4().hex, uuid.uuid4().hex
    foreign = naming.host_veth(f"{foreign_cid}.eth0")
    old = naming.host_veth(f"{old_cid}.eth0")
    in_ns(agent.netns, "ip", "link", "add", foreign, "type", "veth", "peer", "name", "pwtf0")
    in_ns(agent.netns, "ip", "link", "add", old, "address", host_mac(f"{old_cid}.eth0"),
          "type", "veth", "peer", "name", "pwto0")  # fmt: skip
    try:
        for cid in (foreign_cid, old_cid):
            delete = await acni(plugin, "DEL", agent.conf(vxnet.id), container_id=cid)
            assert delete.code == 0, delete.stdout
        present = links_in(agent.netns)
        assert foreign in present  # named like ours, but neither marked nor our MAC
        assert old not in present  # made by an agent from before marks: its MAC is ours
    finally:
        in_ns(agent.netns, "ip", "link", "del", foreign, check=False)
        in_ns(agent.netns, "ip", "link", "del", old, check=False)


async def _gone(ns: str, name: str) -> bool:
    return name not in links_in(ns)
