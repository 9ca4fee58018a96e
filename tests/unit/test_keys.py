from __future__ import annotations

import pytest

from podwire import keys


def test_layout() -> None:
    assert keys.node_port("h1", "p1") == "/podwire/nodes/h1/ports/p1"
    assert keys.state_alive("h1") == "/podwire/state/nodes/h1/alive"
    assert keys.state_physnet("h1", "physnet1") == "/podwire/state/nodes/h1/physnets/physnet1"
    assert keys.state_vtep("h1") == "/podwire/state/nodes/h1/vtep"
    assert keys.state_capabilities("h1") == "/podwire/state/nodes/h1/capabilities"
    assert keys.state_port("h1", "p1") == "/podwire/state/nodes/h1/ports/p1"
    assert keys.vif("h1", "c1_eth0") == "/podwire/vifs/h1/c1_eth0"
    assert keys.election("forwarder") == "/podwire/election/forwarder"


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "-x", "x y", "a" * 254])
def test_segments_cannot_escape_their_node(bad: str) -> None:
    with pytest.raises(ValueError, match="not a valid name"):
        keys.node_port(bad, "p1")
    with pytest.raises(ValueError, match="not a valid name"):
        keys.state_port("h1", bad)


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("/podwire/state/nodes/h1/alive", ("h1", "alive", None)),
        ("/podwire/state/nodes/h1/ports/p9", ("h1", "ports", "p9")),
        ("/podwire/state/nodes/h1/physnets/physnet1", ("h1", "physnets", "physnet1")),
        ("/podwire/state/nodes/h1/ports/", None),
        ("/podwire/state/nodes/h1/unknown", None),
        ("/podwire/nodes/h1/ports/p1", None),
    ],
)
def test_parse_state_key(key: str, parsed: tuple[str, str, str | None] | None) -> None:
    assert keys.parse_state_key(key) == parsed


def test_status_reads_both_election_value_forms() -> None:
    from podwire.etcd.client import KeyValue
    from podwire.status.nodes import _holder

    def kv(value: bytes) -> KeyValue:
        return KeyValue("/podwire/election/x", value, 1, 1, 1, 0)

    assert _holder(kv(b"neutron-1:42")) == "neutron-1:42"
    assert _holder(kv(b'{"v": 1, "identity": "ctl-a:7", "since": 1.0}')) == "ctl-a:7"
