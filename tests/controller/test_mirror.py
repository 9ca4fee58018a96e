"""When the forwarder's etcd mirror may stand in for a Neutron listing, and what it yields."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from podwire import keys
from podwire.controller.mirror import REPORT_MAX_AGE, forwarder_doubt, mirrored_vif
from podwire.controller.recovery import LEFTOVER_MARGIN, _created_before
from podwire.errors import ValidationError
from podwire.neutron.client import PortSummary
from podwire.schema.inuse import PoolKey

NOW = 1_800_000_000.0


def _report(**fields: Any) -> bytes:
    return json.dumps({"v": 1, "journal_depth": 0, "updated_at": NOW - 1, **fields}).encode()


@pytest.mark.parametrize(
    ("report", "doubt"),
    [
        (None, "no ml2 forwarder has reported"),
        (b"{", "not valid JSON"),
        (_report(journal_depth=3), "holds 3 rows"),
        (_report(updated_at=NOW - REPORT_MAX_AGE - 5), "15 s old"),
        (_report(updated_at="yesterday"), "updated_at: expected a number"),
    ],
)
def test_forwarder_doubts(report: bytes | None, doubt: str) -> None:
    found = forwarder_doubt(report, NOW)
    assert found is not None and doubt in found


def test_a_fresh_report_of_an_empty_journal_vouches_for_the_mirror() -> None:
    assert forwarder_doubt(_report(), NOW) is None


PROJECT = "0123456789abcdef0123456789abcdef"
SG = "5e3ad7a8-9a1b-4c2d-8e3f-0123456789ab"


def _desired(**fields: Any) -> bytes:
    value = {
        "v": 1,
        "port_id": str(uuid.uuid4()),
        "network_id": str(uuid.uuid4()),
        "project_id": PROJECT,
        "mac_address": "fa:16:3e:00:00:01",
        "mtu": 1450,
        "network_type": "vxlan",
        "physnet": None,
        "segmentation_id": 7,
        "vif_type": "veth",
        "vif_details": {},
        "fixed_ips": [
            {"ip_address": "10.0.0.5", "subnet_id": "s", "cidr": "10.0.0.0/24", "gateway_ip": None}
        ],
        "security_groups": [SG],
        "device_owner": "compute:podwire",
        "device_id": "",
        "trunk": None,
        **fields,
    }
    return json.dumps(value).encode()


def test_mirror_entries_become_pool_ports_keyed_by_their_host() -> None:
    raw = _desired()
    value = json.loads(raw)
    found = mirrored_vif(keys.node_port("node-a", value["port_id"]), raw)
    assert found is not None
    key, vif = found
    assert key == PoolKey("node-a", PROJECT, value["network_id"])
    assert (vif.port_id, vif.mtu, vif.security_groups) == (value["port_id"], 1450, [SG])
    assert vif.fixed_ips[0].cidr == "10.0.0.0/24"


def test_other_owners_and_foreign_keys_are_not_pool_ports() -> None:
    raw = _desired(device_owner="compute:nova")
    assert mirrored_vif(keys.node_port("node-a", json.loads(raw)["port_id"]), raw) is None
    assert mirrored_vif("/podwire/nodes/node-a/other", _desired()) is None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"project_id": None}, "older ml2 driver"),
        ({"mac_address": "nope"}, "mac"),
        ({"v": 2}, "schema version"),
    ],
)
def test_unusable_entries_of_ours_are_named(fields: dict[str, Any], problem: str) -> None:
    raw = _desired(**fields)
    with pytest.raises(ValidationError, match=problem):
        mirrored_vif(keys.node_port("node-a", json.loads(raw)["port_id"]), raw)


def _summary(created_at: str) -> PortSummary:
    return PortSummary("p", "n", "pr", "fa:16:3e:00:00:01", [], [], "", "", "", created_at)


def test_only_ports_that_surely_predate_recovery_count_as_leftovers() -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - LEFTOVER_MARGIN - 2))
    assert _created_before(_summary(stamp), now)
    assert not _created_before(_summary(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))), now)
    assert not _created_before(_summary(""), now)
