"""Nested mode in real namespaces: needs a kernel with 8021q, which these machines lack."""

from __future__ import annotations

import pytest

from podwire.agent.app import vlan_capable
from podwire.agent.ports.veth import Plugger, PlugSpec
from podwire.netlink import HostNetlink, PodNetlink
from podwire.schema.checkpoints import Address
from tests.agent.netenv import NetEnv, in_ns

pytestmark = pytest.mark.skipif(
    not vlan_capable(), reason="kernel lacks 8021q (VLAN) support: nested mode cannot run here"
)


async def test_pod_gets_vlan_subinterface_of_the_uplink(netenv: NetEnv) -> None:
    host, _ = netenv.host(1)
    pod = netenv.namespace("pod")
    host_nl, pod_nl = HostNetlink(host), PodNetlink()
    try:
        spec = PlugSpec(
            "c.eth0",
            f"/run/netns/{pod}",
            "eth0",
            "fa:16:3e:00:00:09",
            1400,
            "",
            (Address("10.9.0.5/24", "10.9.0.1"),),
        )
        attached = await Plugger(host_nl, pod_nl).plug_nested(spec, "eth0", 101)
        detail = in_ns(pod, "ip", "-d", "link", "show", "eth0").stdout
        assert "vlan protocol 802.1Q id 101" in detail and "fa:16:3e:00:00:09" in detail
        assert "10.9.0.5/24" in in_ns(pod, "ip", "addr", "show", "eth0").stdout
        assert attached.host_ifname == "eth0"
    finally:
        host_nl.close()
        pod_nl.close()
