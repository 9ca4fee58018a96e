"""What ``podwire status`` shows of a node's memif ports, and the strict reader of that value
(another node's agent writes it; a bad one is counted, never shown or fatal)."""

from __future__ import annotations

import json

import pytest

from podwire.errors import ValidationError
from podwire.etcd.client import KeyValue
from podwire.schema import nodes
from podwire.status.nodes import NodeStatus, _apply_state
from podwire.status.render import _memif_lines
from podwire.status.report import Report

PORT = "5c1d2e3f-0000-4000-8000-000000000001"
KEY = "/podwire/state/nodes/n1/memif"


def _state(**changes: object) -> nodes.MemifPortState:
    fields: dict[str, object] = {
        "port_id": PORT, "tap": "pwt0123456789ab", "path": "shared", "connected": True,
        "from_client": 10, "to_client": 20, "to_kernel": 1, "to_shared": 9, "drops": 3,
        "ring_full": 2,
    }  # fmt: skip
    fields.update(changes)
    return nodes.MemifPortState(**fields)  # type: ignore[arg-type]


def test_status_lists_each_memif_port_with_its_path() -> None:
    node = NodeStatus("n1")
    raw = nodes.memif_state_value([_state(), _state(tap="pwtffffffffffff", path="kernel")], 1.0)
    _apply_state(node, "memif", None, KeyValue(KEY, raw, 1, 1, 1, 0))
    assert [p.path for p in node.memif] == ["shared", "kernel"]
    lines = _memif_lines(Report(nodes=[node]))
    assert lines[1] == "MEMIF PORTS"
    assert "shared" in lines[3] and lines[3].split()[-1] == "2"  # ring full
    assert _memif_lines(Report(nodes=[NodeStatus("n2")])) == []  # no memif: no section


def _raw(port: dict[str, object]) -> bytes:
    body = json.loads(nodes.memif_state_value([_state()], 1.0))
    body["ports"][0].update(port)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"path": "fast"}, "path"),
        ({"tap": "eth0/../x"}, "tap"),
        ({"drops": -1}, "drops"),
        ({"port_id": "not-a-uuid"}, "port_id"),
        ({"extra": 1}, "extra"),
        ({"connected": "yes"}, "connected"),
        ({"why": "x" * 201}, "why"),
        ({"denied": -1}, "denied"),
    ],
)
def test_bad_memif_state_is_refused_by_name(change: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        nodes.parse_memif_state(_raw(change))
    node = NodeStatus("n1")
    _apply_state(node, "memif", None, KeyValue(KEY, _raw(change), 1, 1, 1, 0))
    assert node.bad_values == 1 and node.memif == []


def test_a_filtered_port_shows_why_and_its_classifier_counters() -> None:
    node = NodeStatus("n1")
    port = _state(why="security groups in the master", admitted=40, spoofed=1, denied=2)
    raw = nodes.memif_state_value([port], 1.0)
    _apply_state(node, "memif", None, KeyValue(KEY, raw, 1, 1, 1, 0))
    lines = _memif_lines(Report(nodes=[node]))
    assert "shared path: security groups in the master" in lines[4]
    assert "admitted 40, dropped 1 spoofed, 2 denied, 0 invalid" in lines[4]


def test_a_value_from_an_agent_before_classifiers_reads_with_zero_counters() -> None:
    body = json.loads(nodes.memif_state_value([_state()], 1.0))
    for name in ("why", *nodes.FILTER_COUNTERS):
        del body["ports"][0][name]
    (port,) = nodes.parse_memif_state(json.dumps(body).encode())
    assert port.why == "" and port.denied == 0
