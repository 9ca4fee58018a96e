"""The agent's memif checkpoint entries: round trip, and damaged entries refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from podwire.agent.memif import tap_name
from podwire.agent.memif_state import MemifCheckpoint, MemifEntry
from podwire.cni.result import Address
from podwire.errors import ValidationError
from podwire.schema.vif import Vif
from tests.unit.test_vif import GOOD

ATTACHMENT = "0123456789abcdef:eth0"


def _entry() -> MemifEntry:
    return MemifEntry(
        attachment=ATTACHMENT,
        vif_attachment="0123456789abcdef:memif0",
        pod={"namespace": "default", "name": "cnf"},
        vif=Vif.from_json(GOOD),
        host_dir="/run/podwire/memif/0123456789abcdef0123",
        socket="/run/podwire/memif/0123456789abcdef0123/memif.sock",
        container_socket="/run/vpp/memif.sock",
        secret="abcdefghijklmnopqrstuvwx",
        tap=tap_name("0123456789abcdef:memif0"),
        bridge="pwbr0aaafa7ae6b",
        mtu=1450,
        addresses=(Address("10.1.0.5/24", "10.1.0.1"),),
        pid=1234,
        started=99,
    )


async def test_round_trip_through_the_file(tmp_path: Path) -> None:
    store = MemifCheckpoint(str(tmp_path))
    await store.put(_entry())
    assert (tmp_path / "memif-attachments.json").stat().st_mode & 0o777 == 0o600
    again = MemifCheckpoint(str(tmp_path))
    again.load()
    assert again.entries == {ATTACHMENT: _entry()}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("socket", "relative/memif.sock", "must be an absolute path"),
        ("tap", "much-too-long-interface", "tap"),
        ("addresses", [{"address": "10.1.0.5"}], "not an address with a prefix length"),
        ("secret", "x" * 25, "secret"),
        ("pod", {"namespace": "Bad_Name", "name": "cnf"}, "pod"),
    ],
)
def test_bad_entries_are_refused(field: str, value: Any, message: str) -> None:
    raw = _entry().to_json()
    raw[field] = value
    with pytest.raises(ValidationError, match=message):
        MemifEntry.from_json(ATTACHMENT, json.loads(json.dumps(raw)))


async def test_a_bad_entry_is_skipped_the_rest_load(tmp_path: Path) -> None:
    good = _entry().to_json()
    body = {"v": 1, "memifs": {ATTACHMENT: good, "x:eth1": {"socket": 3}}}
    (tmp_path / "memif-attachments.json").write_text(json.dumps(body))
    store = MemifCheckpoint(str(tmp_path))
    store.load()
    assert list(store.entries) == [ATTACHMENT]


def test_tap_names_fit_ifnamsiz() -> None:
    assert len(tap_name("a" * 64 + ":memif0")) == 15
