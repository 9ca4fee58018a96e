"""The agent's checkpoint files and entries: round trip, entries of earlier agents, damaged
files and hostile entries refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from podwire.agent.naming import memif_tap
from podwire.agent.ports.checkpoint import attachments, memifs
from podwire.errors import ConfigError, ValidationError
from podwire.schema.checkpoints import Address, MemifEntry, attachment_entry, memif_entry
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
        tap=memif_tap("0123456789abcdef:memif0"),
        bridge="pwbr0aaafa7ae6b",
        mtu=1450,
        addresses=(Address("10.1.0.5/24", "10.1.0.1"),),
        pid=1234,
        started=99,
    )


async def test_round_trip_through_the_file(tmp_path: Path) -> None:
    store = memifs(str(tmp_path))
    await store.put(_entry())
    assert (tmp_path / "memif-attachments.json").stat().st_mode & 0o777 == 0o600
    again = memifs(str(tmp_path))
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
        memif_entry(ATTACHMENT, json.loads(json.dumps(raw)))


async def test_a_bad_entry_is_skipped_the_rest_load(tmp_path: Path) -> None:
    good = _entry().to_json()
    body = {"v": 1, "memifs": {ATTACHMENT: good, "x:eth1": {"socket": 3}}}
    (tmp_path / "memif-attachments.json").write_text(json.dumps(body))
    store = memifs(str(tmp_path))
    store.load()
    assert list(store.entries) == [ATTACHMENT]


def test_tap_names_fit_ifnamsiz() -> None:
    assert len(memif_tap("a" * 64 + ":memif0")) == 15


def _attachment_raw() -> dict[str, Any]:
    """An entry as agents wrote it before the schema readers (pod uid empty, old form)."""
    return {
        "container_id": "0123456789abcdef",
        "ifname": "eth0",
        "network_name": "podwire",
        "netns": "/run/netns/pod-a",
        "pod": {"namespace": "default", "name": "web", "uid": ""},
        "vif": dict(GOOD),
        "attached": {
            "host_ifname": "pwp0123456789ab",
            "host_mac": "02:11:22:33:44:55",
            "ifname": "eth0",
            "mac": "fa:16:3e:00:00:01",
            "mtu": 1450,
            "sandbox": "/run/netns/pod-a",
            "addresses": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1"}],
        },
    }


def test_attachment_entries_of_earlier_agents_read_and_round_trip() -> None:
    # The key agents wrote before the ':' separator.
    entry = attachment_entry("0123456789abcdef.eth0", _attachment_raw())
    assert entry.attachment == ATTACHMENT and entry.pod == {"namespace": "default", "name": "web"}
    assert entry.attached.addresses == (Address("10.1.0.5/24", "10.1.0.1"),)
    assert attachment_entry(ATTACHMENT, json.loads(json.dumps(entry.to_json()))) == entry


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("container_id",), "../etc", "container id"),
        (("ifname",), "eth1", "does not name container"),
        (("netns",), "pod-a", "must be an absolute path"),
        (("attached", "host_ifname"), "x" * 16, "interface name"),
        (("attached", "mac"), "ff:ff:ff:ff:ff:ff", "not a unicast MAC"),
        (("attached", "mtu"), 70000, "mtu"),
        (("attached", "addresses"), [{"address": "10.1.0.5"}] * 9, "addresses"),
        (("pod",), {"namespace": "default", "name": "Web!"}, "pod"),
        (("vif", "port_id"), "not-a-uuid", "port_id"),
    ],
)
def test_hostile_attachment_entries_are_refused_by_name(
    path: tuple[str, ...], value: Any, message: str
) -> None:
    raw = _attachment_raw()
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValidationError, match=message):
        attachment_entry(ATTACHMENT, raw)


def test_a_damaged_attachments_file_stops_the_agent_naming_the_file(tmp_path: Path) -> None:
    for content, problem in (
        (b"", "file is empty"),
        (b"[1]", "top level must be a JSON object"),
        (b'{"v": 7}', "written by a newer podwire"),
        (b'{"v": 1, "attachments": []}', "expected a JSON object"),
    ):
        (tmp_path / "cni-attachments.json").write_bytes(content)
        with pytest.raises(ConfigError, match=problem) as info:
            attachments(str(tmp_path)).load()
        assert str(tmp_path / "cni-attachments.json") in str(info.value)
