"""Binder against real etcd and real namespaces, with desired keys written directly."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from podwire import keys
from podwire.agent import naming
from podwire.agent.fabric.binder import Binder, BinderSettings, PortVanished
from podwire.agent.fabric.peers import PeerTracker
from podwire.agent.metrics import AgentMetrics
from podwire.etcd import EtcdClient
from podwire.netlink import HostNetlink
from podwire.schema import nodes as values
from podwire.schema.ports import DesiredPort, parse_desired_port
from tests.agent.desired_keys import desired_value
from tests.agent.netenv import NetEnv, in_ns, links_in
from tests.etcd_tools import delete_prefix
from tests.scripted_agent import eventually

pytestmark = pytest.mark.stack


@pytest.fixture
def metrics() -> AgentMetrics:
    return AgentMetrics()


@pytest.fixture
async def bound(
    etcd: EtcdClient, netenv: NetEnv, hostnames: list[str], metrics: AgentMetrics
) -> AsyncIterator[tuple[Binder, str, str]]:
    ns, vtep = netenv.host(1)
    phys = netenv.physnet_link(ns)
    nl = HostNetlink(ns)
    settings = BinderSettings(hostnames[0], vtep, {"physnet1": phys}, vlan_capable=False)
    binder = Binder(etcd, nl, settings, metrics)
    tracker = PeerTracker(etcd, hostnames[0], binder.set_peers, vtep, metrics)
    tasks = [asyncio.create_task(binder.run()), asyncio.create_task(tracker.run())]
    await asyncio.wait_for(binder.synced.wait(), 10)
    try:
        yield binder, ns, hostnames[0]
        for task in tasks:  # nothing a test wrote into etcd may have stopped them
            assert not task.done(), task
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        nl.close()


def _ids() -> tuple[str, str]:
    return str(uuid.uuid4()), str(uuid.uuid4())


def _ip(address: str = "10.1.0.5") -> list[dict[str, str]]:
    return [
        {"ip_address": address, "subnet_id": "s", "cidr": "10.1.0.0/24", "gateway_ip": "10.1.0.1"}
    ]


async def test_vxlan_port_wires_plumbing_and_state(
    bound: tuple[Binder, str, str], etcd: EtcdClient
) -> None:
    binder, ns, host = bound
    port, net = _ids()
    await etcd.put(
        keys.node_port(host, port),
        desired_value(port, net, "fa:16:3e:00:00:01", _ip(), segmentation_id=4242),
    )
    wired = await binder.wait_wired(port, 10)
    assert wired.segmentation_id == 4242
    assert await etcd.get(keys.state_port(host, port)) is not None
    detail = in_ns(ns, "ip", "-d", "link", "show", naming.vxlan(net)).stdout
    assert "vxlan id 4242" in detail and "local 192.0.2.11" in detail
    assert f"master {naming.bridge(net)}" in detail

    await etcd.delete(keys.node_port(host, port))
    await eventually(lambda: _gone(etcd, keys.state_port(host, port)), "state key removed")
    await eventually(lambda: _no_link(ns, naming.bridge(net)), "bridge removed")
    assert naming.vxlan(net) not in links_in(ns)


async def test_flood_entries_follow_alive_peers(
    bound: tuple[Binder, str, str], etcd: EtcdClient, hostnames: list[str]
) -> None:
    binder, ns, host = bound
    port, net = _ids()
    await etcd.put(keys.node_port(host, port), desired_value(port, net, "fa:16:3e:00:00:02", _ip()))
    await binder.wait_wired(port, 10)
    other = hostnames[1]
    await etcd.put(keys.state_vtep(other), values.vtep_value("192.0.2.99"))
    lease = await etcd.grant_lease(30)
    await etcd.put(keys.state_alive(other), values.alive_value(0, "t"), lease=lease.id)

    def fdb() -> str:
        return in_ns(ns, "bridge", "fdb", "show", "dev", naming.vxlan(net)).stdout

    async def flooded() -> bool:
        return "dst 192.0.2.99" in fdb()

    async def not_flooded() -> bool:
        return "dst 192.0.2.99" not in fdb()

    await eventually(flooded, "flood entry to the new host")
    await lease.revoke()
    await eventually(not_flooded, "flood entry gone with the dead host")
    await etcd.delete(keys.node_port(host, port))


async def test_peer_vteps_that_cannot_be_flood_entries_are_skipped(
    bound: tuple[Binder, str, str], etcd: EtcdClient, netenv: NetEnv
) -> None:
    """Any node writes its own VTEP: an IPv6 one once crashed every IPv4 agent (EAFNOSUPPORT),
    multicast or broadcast ones became flood entries everywhere."""
    binder, ns, host = bound
    port, net = _ids()
    await etcd.put(keys.node_port(host, port), desired_value(port, net, "fa:16:3e:00:00:06", _ip()))
    await binder.wait_wired(port, 10)
    own = "192.0.2.11"  # the bound fixture's host 1
    bad = ["2001:db8::7", "224.0.0.9", "0.0.0.0", "255.255.255.255", "240.0.0.1", own, "x", ""]
    bad += ["127.0.0.1", "169.254.0.5"]  # loopback would bounce every broadcast back here
    peers = [f"{host}-peer{i}" for i in range(len(bad) + 1)]
    lease = await etcd.grant_lease(30)
    try:
        for peer, vtep in zip(peers, [*bad, "192.0.2.77"], strict=True):
            await etcd.put(keys.state_vtep(peer), values.vtep_value(vtep))
            await etcd.put(keys.state_alive(peer), values.alive_value(0, "t"), lease=lease.id)
        await etcd.put(keys.state_vtep(peers[0] + "-junk"), b'{"v": 1, "ip": ' + b"[" * 5000)

        def fdb() -> str:
            return in_ns(ns, "bridge", "fdb", "show", "dev", naming.vxlan(net)).stdout

        async def good_peer_flooded() -> bool:
            return "dst 192.0.2.77" in fdb()

        await eventually(good_peer_flooded, "flood entry to the one good peer")
        entries = [line for line in fdb().splitlines() if line.startswith("00:00:00:00:00:00")]
        assert len(entries) == 1, entries
    finally:
        await lease.revoke()
        for peer in peers:
            await delete_prefix(etcd, keys.state_node_prefix(peer))
        await etcd.delete(keys.state_vtep(peers[0] + "-junk"))
        await etcd.delete(keys.node_port(host, port))


async def test_desired_keys_no_port_id_can_make_are_skipped(
    bound: tuple[Binder, str, str], etcd: EtcdClient
) -> None:
    """A port id holding '/' once put the agent in a crash loop."""
    binder, _, host = bound
    port, net = _ids()
    odd = [keys.node_ports_prefix(host) + name for name in ("a/b", "x\n", ".hidden", "")]
    for key in odd:
        await etcd.put(key, desired_value(port, net, "fa:16:3e:00:00:07", _ip()))
    await etcd.put(keys.node_port(host, port), desired_value(port, net, "fa:16:3e:00:00:07", _ip()))
    await binder.wait_wired(port, 10)
    assert set(binder.wired) == {port} and not binder.failed
    for key in odd:
        await etcd.delete(key)
    await etcd.delete(keys.node_port(host, port))


async def test_flat_port_enslaves_physnet_and_bad_values_are_skipped(
    bound: tuple[Binder, str, str], etcd: EtcdClient
) -> None:
    binder, ns, host = bound
    port, net = _ids()
    value = desired_value(port, net, "fa:16:3e:00:00:03", _ip(), "flat", None, "physnet1", 1500)
    bad = str(uuid.uuid4())
    await etcd.put(keys.node_port(host, bad), b"{not json")
    await etcd.put(keys.node_port(host, port), value)
    await binder.wait_wired(port, 10)
    assert f"master {naming.bridge(net)}" in in_ns(ns, "ip", "link", "show", "phys0").stdout
    assert bad in binder.failed and await etcd.get(keys.state_port(host, bad)) is None

    unmapped = str(uuid.uuid4())
    value = desired_value(unmapped, net, "fa:16:3e:00:00:04", _ip(), "flat", None, "nope", 1500)
    await etcd.put(keys.node_port(host, unmapped), value)
    with pytest.raises(Exception, match=r"physnet 'nope' is not in agent\.physnet_mappings"):
        await binder.wait_wired(unmapped, 10)
    await etcd.delete(keys.node_port(host, port))
    await eventually(lambda: _no_link(ns, naming.bridge(net)), "flat bridge removed")
    assert "master" not in in_ns(ns, "ip", "link", "show", "phys0").stdout


async def test_restart_adopts_existing_plumbing(
    etcd: EtcdClient, netenv: NetEnv, hostnames: list[str]
) -> None:
    ns, vtep = netenv.host(1)
    host = hostnames[0]
    port, net = _ids()
    await etcd.put(keys.node_port(host, port), desired_value(port, net, "fa:16:3e:00:00:05", _ip()))
    for _ in range(2):  # the second binder finds everything in place and changes nothing
        nl = HostNetlink(ns)
        binder = Binder(etcd, nl, BinderSettings(host, vtep, {}, vlan_capable=False))
        task = asyncio.create_task(binder.run())
        try:
            await binder.wait_wired(port, 10)
            index = in_ns(ns, "cat", f"/sys/class/net/{naming.bridge(net)}/ifindex").stdout
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            nl.close()
        if _ == 0:
            first_index = index
    assert index == first_index
    await etcd.delete(keys.node_port(host, port))


async def _gone(etcd: EtcdClient, key: str) -> bool:
    return await etcd.get(key) is None


async def _no_link(ns: str, name: str) -> bool:
    return name not in links_in(ns)


async def test_a_wired_port_is_ready_even_when_no_time_is_left(
    bound: tuple[Binder, str, str], etcd: EtcdClient
) -> None:
    """An ADD whose VIF request used up its deadline still gets a port that is wired (it once
    failed with "still has security groups [X] ..., not [X]", the same lists)."""
    binder, _, host = bound
    port, net = _ids()
    await etcd.put(keys.node_port(host, port), desired_value(port, net, "fa:16:3e:00:00:07", _ip()))
    await binder.wait_wired(port, 10)
    assert (await binder.wait_wired(port, 0.0, [])).port_id == port
    await etcd.delete(keys.node_port(host, port))


async def test_a_port_whose_desired_key_went_is_reported_vanished_at_once(
    bound: tuple[Binder, str, str], etcd: EtcdClient
) -> None:
    binder, _, host = bound
    port, net = _ids()
    await etcd.put(keys.node_port(host, port), desired_value(port, net, "fa:16:3e:00:00:08", _ip()))
    await binder.wait_wired(port, 10)
    waiting = asyncio.ensure_future(binder.wait_wired(port, 60, ["not-its-group"]))
    await asyncio.sleep(0.1)
    await etcd.delete(keys.node_port(host, port))
    with pytest.raises(PortVanished, match="deleted or unbound in Neutron"):
        await asyncio.wait_for(waiting, 10)
    with pytest.raises(PortVanished):  # and for an ADD that asks only now
        await binder.wait_wired(port, 60)


async def test_remote_ports_become_static_forwarding_and_arp_answers(
    bound: tuple[Binder, str, str], etcd: EtcdClient, metrics: AgentMetrics
) -> None:
    """No learning from frames: the VXLAN device and the bridge port learn nothing; each
    port another node reports wired, and Neutron bound to it, is a static entry towards that
    node's VTEP and an ARP/ND answer. Claims Neutron does not back (a port bound elsewhere or
    nowhere, another MAC or address than the binding's) are refused; a MAC two bindings share
    (a port moving) stays with the first claim, ties in time going by node name."""
    binder, ns, host = bound
    port, net = _ids()
    await etcd.put(keys.node_port(host, port), desired_value(port, net, "fa:16:3e:00:00:07", _ip()))
    local = await binder.wait_wired(port, 10)
    device = naming.vxlan(net)
    detail = in_ns(ns, "ip", "-d", "link", "show", device).stdout
    assert " nolearning " in detail and " proxy " not in detail
    port_flags = in_ns(ns, "bridge", "-d", "link", "show", "dev", device).stdout
    assert "learning off" in port_flags and "neigh_suppress on" in port_flags
    peers = {"a-honest": "192.0.2.61", "liar": "192.0.2.62", "z-mover": "192.0.2.63"}
    lease = await etcd.grant_lease(30)
    remote = _remote_port(net, "fa:16:3e:aa:00:01", "10.1.0.61")
    liars_own = _remote_port(net, "fa:16:3e:aa:00:02", "10.1.0.62")
    try:
        for peer, vtep in peers.items():
            await etcd.put(keys.state_vtep(f"{host}-{peer}"), values.vtep_value(vtep))
            await etcd.put(keys.state_alive(f"{host}-{peer}"), values.alive_value(0, "t"),
                           lease=lease.id)  # fmt: skip
        await _bind_remote(etcd, f"{host}-a-honest", remote)
        honest_key = keys.state_port(f"{host}-a-honest", remote.port_id)
        await etcd.put(honest_key, values.port_state_value(1.0, remote))
        await _bind_remote(etcd, f"{host}-liar", liars_own)
        lies = [  # each written earlier than the honest claim, with the victim's MAC
            replace(remote, port_id=str(uuid.uuid4())),  # a port bound nowhere
            remote,  # the honest node's own port, bound there
            replace(liars_own, mac_address=remote.mac_address),  # its own port, another MAC
            replace(liars_own, fixed_ips=remote.fixed_ips),  # its own port, another address
        ]
        for lie in lies:
            key = keys.state_port(f"{host}-liar", lie.port_id)
            await etcd.put(key, values.port_state_value(0.0, lie))

        async def entries() -> bool:
            fdb = in_ns(ns, "bridge", "fdb", "show", "dev", device).stdout
            neigh = in_ns(ns, "ip", "neigh", "show", "dev", naming.bridge(net)).stdout
            return (
                "fa:16:3e:aa:00:01 dst 192.0.2.61 self permanent" in fdb
                and "fa:16:3e:aa:00:01 master" in fdb
                and "10.1.0.61 lladdr fa:16:3e:aa:00:01 PERMANENT" in neigh
            )

        await eventually(entries, "the honest node's port as static entries")

        async def all_refused() -> bool:
            sample = "podwire_agent_peer_values_rejected_total"
            return metrics.registry.get_sample_value(sample, {"kind": "claim"}) == len(lies)

        # Every lie refused and counted once; the unbound ones once the bindings caught up.
        # Settled first: a claim decided late re-syncs the device, which would put entries
        # back before the repair pass could (uncounted).
        await eventually(all_refused, "the lies refused")
        await _drift_is_repaired(ns, device, naming.bridge(net), metrics)
        fdb = in_ns(ns, "bridge", "fdb", "show", "dev", device).stdout
        assert "dst 192.0.2.62" not in fdb.replace("00:00:00:00:00:00 dst 192.0.2.62", "")
        neigh = in_ns(ns, "ip", "neigh", "show", "dev", naming.bridge(net)).stdout
        assert "10.1.0.62" not in neigh and "fa:16:3e:aa:00:02" not in neigh

        # The port moves to another node (Neutron bound it there too, for now), claimed at
        # the same time: the first by name keeps it, the same on every node; no crash.
        await _bind_remote(etcd, f"{host}-z-mover", remote)
        await etcd.put(keys.state_port(f"{host}-z-mover", remote.port_id),
                       values.port_state_value(1.0, remote))  # fmt: skip

        fdb = in_ns(ns, "bridge", "fdb", "show", "dev", device).stdout
        assert "fa:16:3e:aa:00:01 dst 192.0.2.61" in fdb, fdb
        await etcd.delete(honest_key)

        async def moved() -> bool:
            fdb = in_ns(ns, "bridge", "fdb", "show", "dev", device).stdout
            return "fa:16:3e:aa:00:01 dst 192.0.2.63 self permanent" in fdb

        await eventually(moved, "the MAC with its remaining claim once the first went")
        assert await all_refused()  # the mover's claim, backed by its binding, refused nothing
        assert local.port_id == port
    finally:
        await lease.revoke()
        for peer in peers:
            await delete_prefix(etcd, keys.state_node_prefix(f"{host}-{peer}"))
            await delete_prefix(etcd, keys.node_prefix(f"{host}-{peer}"))
        await etcd.delete(keys.node_port(host, port))


async def _drift_is_repaired(ns: str, device: str, bridge: str, metrics: AgentMetrics) -> None:
    """Entries deleted or added behind the agent's back come back as they were, counted. A
    change of the peer view landing meanwhile (the shared etcd's other tests' nodes) re-syncs
    the device itself and puts them back uncounted: then the drift is made again."""
    for _attempt in range(3):
        counted = metrics.registry.get_sample_value("podwire_agent_peer_repairs_total") or 0
        await _drift(ns, device, bridge)
        repairs = metrics.registry.get_sample_value("podwire_agent_peer_repairs_total") or 0
        if repairs - counted >= 3:
            return
    raise AssertionError("entries changed behind the agent were put back, but never counted")


async def _drift(ns: str, device: str, bridge: str) -> None:
    in_ns(ns, "bridge", "fdb", "del", "fa:16:3e:aa:00:01", "dev", device, "dst", "192.0.2.61",
          "self")  # fmt: skip
    in_ns(ns, "ip", "neigh", "del", "10.1.0.61", "dev", bridge)
    in_ns(ns, "bridge", "fdb", "del", "00:00:00:00:00:00", "dev", device, "dst", "192.0.2.61")
    in_ns(ns, "bridge", "fdb", "append", "00:00:00:00:00:00", "dev", device, "dst", "192.0.2.99")

    async def repaired() -> bool:
        fdb = in_ns(ns, "bridge", "fdb", "show", "dev", device).stdout
        neigh = in_ns(ns, "ip", "neigh", "show", "dev", bridge).stdout
        return (
            "fa:16:3e:aa:00:01 dst 192.0.2.61 self permanent" in fdb
            and "00:00:00:00:00:00 dst 192.0.2.61 self permanent" in fdb
            and "192.0.2.99" not in fdb
            and "10.1.0.61 lladdr fa:16:3e:aa:00:01 PERMANENT" in neigh
        )

    await eventually(repaired, "the entries changed behind the agent repaired", timeout=10)


async def _bind_remote(etcd: EtcdClient, host: str, port: DesiredPort) -> None:
    """What the ml2 forwarder writes when Neutron binds ``port`` to ``host``."""
    ips = [{"ip_address": ip.ip_address, "subnet_id": "s", "cidr": "10.1.0.0/24"}
           for ip in port.fixed_ips]  # fmt: skip
    value = desired_value(port.port_id, port.network_id, port.mac_address, ips)
    await etcd.put(keys.node_port(host, port.port_id), value)


def _remote_port(net: str, mac: str, ip: str) -> DesiredPort:
    return parse_desired_port(desired_value(str(uuid.uuid4()), net, mac, _ip(ip)))
