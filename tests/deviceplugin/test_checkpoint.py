"""The checkpoint file: validation of every field, atomic root-only writes, group commit."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from podwire.deviceplugin.checkpoint import (
    CheckpointCorrupt,
    CheckpointData,
    CheckpointIncompatible,
    CheckpointStore,
    CheckpointWriteError,
    dump,
)
from podwire.deviceplugin.model import Allocation, PodName

ALLOC = Allocation("0123456789abcdef0123", ("memif-1", "memif-2"), "s" * 24, 1700000000.5)


def data(*allocations: Allocation) -> CheckpointData:
    return CheckpointData("podwire.io/memif", "/var/run/podwire/memif", allocations)


async def test_round_trip_is_root_only_and_leaves_no_temp_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "state" / "cp.json")
    bound = Allocation("abcdefabcdefabcdefab", ("memif-3",), "t" * 24, 1.0, PodName("ns", "pod-a"))
    await store.save(data(ALLOC, bound))
    assert store.load() == data(ALLOC, bound)
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store.path.parent).st_mode) == 0o700
    assert sorted(os.listdir(store.path.parent)) == ["cp.json"]
    assert json.loads(store.path.read_text())["v"] == 1


def test_missing_file_means_first_start(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "none.json").load() is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty (truncated?)"),
        (b'{"v": 1, "resource_name": "podwire.io/me', "not valid JSON"),
        (b"\x00\xff garbage", "not valid JSON"),
        (b"[]", "top level must be a JSON object"),
        (b'{"resource_name": "x"}', "missing or unknown schema version 'v'"),
        (b'{"v": 1, "memif_host_dir": "/x", "allocations": []}', "'resource_name' must be a str"),
    ],
)
def test_unreadable_content_is_reported_clearly(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "cp.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointCorrupt) as info:
        CheckpointStore(path).load()
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_truncated_real_checkpoint_is_corrupt(tmp_path: Path) -> None:
    body = json.dumps(dump(data(ALLOC))).encode()
    path = tmp_path / "cp.json"
    path.write_bytes(body[: len(body) // 2])
    with pytest.raises(CheckpointCorrupt, match="truncated or damaged"):
        CheckpointStore(path).load()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda a: a.update(id="../../etc"), "is not 20 hex digits"),
        (lambda a: a.update(devices=[]), "devices must be a non-empty list"),
        (lambda a: a.update(devices=["memif-1", "memif-1"]), "devices repeat"),
        (lambda a: a.update(secret="short"), "secret must be 24 characters"),
        (lambda a: a.update(created_at="yesterday"), "created_at must be a number"),
        (lambda a: a.update(pod={"namespace": "NS!", "name": "x"}), "is not a valid name"),
        (lambda a: a.update(pod="ns/x"), "pod must be an object or null"),
    ],
)
def test_every_allocation_field_is_validated(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    doc = dump(data(ALLOC))
    mutate(doc["allocations"][0])
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointCorrupt, match="allocations\\[0\\]") as info:
        CheckpointStore(path).load()
    assert message in str(info.value)


def test_a_device_granted_twice_is_corrupt(tmp_path: Path) -> None:
    other = Allocation("ffffffffffffffffffff", ("memif-2",), "u" * 24, 2.0)
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(dump(data(ALLOC, other))))
    with pytest.raises(CheckpointCorrupt, match="device memif-2 is granted twice"):
        CheckpointStore(path).load()


def test_newer_schema_is_not_treated_as_corruption(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    path.write_text(json.dumps({"v": 2, "whatever": True}))
    with pytest.raises(CheckpointIncompatible, match="written by a newer podwire"):
        CheckpointStore(path).load()


def test_quarantine_keeps_the_bad_file_for_the_operator(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    path.write_bytes(b"{broken")
    moved = CheckpointStore(path).quarantine()
    assert not path.exists()
    assert moved.read_bytes() == b"{broken"
    assert moved.name.startswith("cp.json.corrupt-")


async def test_concurrent_saves_share_writes_and_keep_the_newest_state(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    states = [data(Allocation(f"{i:020x}", (f"memif-{i}",), "s" * 24, float(i))) for i in range(50)]
    await asyncio.gather(*(store.save(state) for state in states))
    assert store.load() == states[-1]
    assert 1 <= store.writes < 50


async def test_write_failure_is_a_retryable_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    store = CheckpointStore(blocker / "cp.json")
    with pytest.raises(CheckpointWriteError, match="cannot write"):
        await store.save(data(ALLOC))
