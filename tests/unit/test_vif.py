from __future__ import annotations

import copy
from dataclasses import asdict, replace
from typing import Any

import pytest

from podwire.errors import ValidationError
from podwire.schema.doc import SCHEMA_VERSION
from podwire.schema.vif import Vif

GOOD: dict[str, Any] = {
    "v": 1,
    "port_id": "7d7c0f0e-1a2b-4c3d-8e9f-001122334455",
    "network_id": "0aaafa7a-e6be-4119-89f2-6070b63f72c6",
    "project_id": "0123456789abcdef0123456789abcdef",
    "mac_address": "FA:16:3E:66:F4:E5",
    "mtu": 1450,
    "fixed_ips": [
        {
            "ip_address": "10.1.0.5",
            "subnet_id": "s1",
            "cidr": "10.1.0.0/24",
            "gateway_ip": "10.1.0.1",
        }
    ],
    "segmentation_id": 1001,
}


def test_round_trip_normalises_mac() -> None:
    vif = Vif.from_json(GOOD)
    assert vif.mac_address == "fa:16:3e:66:f4:e5"
    assert Vif.from_json(vif.to_json()) == vif


def test_to_json_writes_every_field() -> None:
    vif = replace(Vif.from_json(GOOD), vlan_id=7, security_groups=["sg-a"])
    written = asdict(vif)
    for item in written["fixed_ips"]:
        del item["host_routes"]  # written only when there are some
    assert vif.to_json() == {"v": SCHEMA_VERSION, **written}


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("v", 2, "unsupported schema version 2"),
        ("port_id", "../etc", "port_id: '../etc' is not a UUID"),
        ("mac_address", "zz:16:3e:66:f4:e5", "mac_address"),
        ("mtu", 10, "mtu: expected an integer from 68"),
        ("mtu", True, "mtu: expected an integer"),
        ("fixed_ips", "10.0.0.1", "fixed_ips: expected a list"),
        ("vlan_id", 5000, "vlan_id: expected an integer from 1 to 4094"),
    ],
)
def test_bad_fields_are_named(path: str, value: Any, message: str) -> None:
    raw = copy.deepcopy(GOOD)
    raw[path] = value
    with pytest.raises(ValidationError, match=message):
        Vif.from_json(raw)


def test_address_outside_its_subnet() -> None:
    raw = copy.deepcopy(GOOD)
    raw["fixed_ips"][0]["ip_address"] = "10.9.0.5"
    with pytest.raises(ValidationError, match=r"not inside 10\.1\.0\.0/24"):
        Vif.from_json(raw)


def test_missing_field() -> None:
    raw = copy.deepcopy(GOOD)
    del raw["mtu"]
    with pytest.raises(ValidationError, match="field 'mtu' is required"):
        Vif.from_json(raw)


def test_a_port_of_a_pod_many_policies_select_is_read_back() -> None:
    """Its CNI config's group and one per NetworkPolicy (20 of them): the answer and the
    in-use record carry 21 groups; past the mirror's 64 a VIF is refused, naming the field."""
    groups = [f"00000000-0000-4000-8000-{n:012d}" for n in range(21)]
    vif = replace(Vif.from_json(GOOD), security_groups=groups)
    assert Vif.from_json(vif.to_json()).security_groups == groups
    too_many = [f"00000000-0000-4000-8000-{n:012d}" for n in range(65)]
    with pytest.raises(ValidationError, match="security_groups"):
        Vif.from_json({**GOOD, "security_groups": too_many})
