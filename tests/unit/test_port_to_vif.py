"""The one Neutron port -> VIF conversion (controller pools, the agent's neutron VIF source).

Unit tests of its rules on plain objects; the real-stack tests of both paths (the controller's
and the agent's ``vif_source = "neutron"``) go through the same function.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from podwire.agent.cni.result import render
from podwire.errors import ValidationError
from podwire.neutron.vifs import NetworkInfo, port_to_vif
from podwire.schema.checkpoints import Address, Attached, _address
from podwire.schema.ports import fixed_ip

NET = SimpleNamespace(
    id="net-1",
    project_id="p1",
    is_shared=False,
    mtu=None,
    provider_network_type=None,
    provider_segmentation_id="1001",
)
SUBNET = SimpleNamespace(id="s1", cidr="10.1.0.0/24", gateway_ip="10.1.0.1")


def _port(**changes: Any) -> SimpleNamespace:
    fields: dict[str, Any] = {
        "id": "port-1",
        "project_id": "p1",
        "mac_address": "FA:16:3E:66:F4:E5",
        "fixed_ips": [{"ip_address": "10.1.0.5", "subnet_id": "s1"}],
        "security_group_ids": ["sg-b", "sg-a"],
        "binding_vif_type": "veth",
    }
    fields.update(changes)
    return SimpleNamespace(**fields)


def test_one_rule_set_for_mac_sgs_network_facts() -> None:
    vif = port_to_vif(_port(), NetworkInfo.from_neutron(NET, [SUBNET]))
    assert vif.mac_address == "fa:16:3e:66:f4:e5"
    assert vif.security_groups == ["sg-a", "sg-b"]
    assert (vif.mtu, vif.network_type, vif.segmentation_id) == (1500, "vxlan", 1001)
    assert [(ip.ip_address, ip.cidr, ip.gateway_ip) for ip in vif.fixed_ips] == [
        ("10.1.0.5", "10.1.0.0/24", "10.1.0.1")
    ]


def test_a_port_on_an_unknown_subnet_is_refused() -> None:
    with pytest.raises(ValidationError, match="subnet s9 is not on its network"):
        port_to_vif(
            _port(fixed_ips=[{"ip_address": "10.9.0.5", "subnet_id": "s9"}]),
            NetworkInfo.from_neutron(NET, [SUBNET]),
        )


@pytest.mark.parametrize(
    ("bound", "expected"),
    [("vhostuser", "vhostuser"), ("binding_failed", "veth"), ("unbound", "veth"), (None, "veth")],
)
def test_vif_type_comes_from_the_binding(bound: str | None, expected: str) -> None:
    vif = port_to_vif(_port(binding_vif_type=bound), NetworkInfo.from_neutron(NET, [SUBNET]))
    assert vif.vif_type == expected


def test_host_routes_travel_with_the_address_and_bad_ones_name_the_subnet() -> None:
    routes = [{"destination": "192.168.0.0/16", "nexthop": "10.1.0.254"}]
    subnet = SimpleNamespace(**{**vars(SUBNET), "host_routes": routes})
    vif = port_to_vif(_port(), NetworkInfo.from_neutron(NET, [subnet]))
    (fixed,) = vif.fixed_ips
    assert [route.to_dict() for route in fixed.host_routes] == routes
    assert fixed_ip(fixed.to_dict(), "fixed") == fixed
    attached = Address(fixed.interface, fixed.gateway_ip, fixed.host_routes)
    rendered = render(Attached("h", "m", "eth0", "m", 1500, "/ns", (attached,)), "1.1.0", None)
    assert rendered["routes"] == [
        {"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
        {"dst": "192.168.0.0/16", "gw": "10.1.0.254"},
    ]
    for bad, problem in (
        ({"destination": "fd00::/64", "nexthop": "10.1.0.254"}, "not an IPv4"),
        ({"destination": "192.168.0.1/16", "nexthop": "10.1.0.254"}, "host bits"),
        ({"destination": "192.168.0.0/16", "nexthop": "224.0.0.1"}, "224.0.0.1"),
        ({"destination": "192.168.0.0/16", "nexthop": "10.1.0.254", "x": 1}, "unknown fields x"),
    ):
        broken = SimpleNamespace(**{**vars(SUBNET), "host_routes": [bad]})
        with pytest.raises(ValidationError, match=f"subnet s1 host_routes\\[0\\].*{problem}"):
            NetworkInfo.from_neutron(NET, [broken])


def test_an_old_checkpoint_without_routes_still_reads() -> None:
    assert _address({"address": "10.1.0.5/24", "gateway": None}, "a").routes == ()
