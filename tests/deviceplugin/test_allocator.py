"""Grants without gRPC: validation, all-or-nothing, preferred order, reconciliation plans."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from podwire.deviceplugin.allocator import (
    AllocateRejected,
    DevicesUnavailable,
    MemifAllocator,
)
from podwire.deviceplugin.checkpoint import (
    CheckpointIncompatible,
    CheckpointStore,
    CheckpointWriteError,
)
from podwire.deviceplugin.model import Allocation, PodName
from podwire.deviceplugin.reconcile import plan

from .conftest import dirs_in, make_settings


def allocator(root: Path, devices: int = 4, checkpoint: Path | None = None) -> MemifAllocator:
    settings = make_settings(root, devices=devices)
    if checkpoint is not None:
        settings = make_settings(root, devices=devices, checkpoint=str(checkpoint))
    os.makedirs(settings.memif_host_dir, exist_ok=True)
    return MemifAllocator(settings, CheckpointStore(settings.checkpoint))


async def test_grant_has_fresh_dir_secret_and_is_checkpointed(tmp_path: Path) -> None:
    alloc = allocator(tmp_path)
    (grant,) = await alloc.allocate([["memif-0", "memif-3"]])
    info = grant.info
    assert Path(info.host_dir).is_dir()
    assert Path(info.host_dir).parent == tmp_path / "memif"
    assert info.host_socket == os.path.join(info.host_dir, "memif.sock")
    assert info.container_socket == "/run/vpp/memif.sock"
    assert len(info.secret) == 24
    saved = CheckpointStore(alloc.settings.checkpoint).load()
    assert saved is not None
    assert [a.devices for a in saved.allocations] == [("memif-0", "memif-3")]


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([], "empty request: no container_requests"),
        ([["memif-0"], []], "container_requests[1] has no devices_ids"),
        ([["memif-9"]], "unknown device id 'memif-9'"),
        ([["gpu-0"]], "unknown device id 'gpu-0'"),
        ([["memif-01"]], "unknown device id 'memif-01'"),
        ([["memif-1", "memif-1"]], "device id 'memif-1' is listed more than once"),
        ([["memif-1"], ["memif-1"]], "device id 'memif-1' is listed more than once"),
        ([["memif-0", "memif-1", "memif-2"], ["memif-3", "memif-4"]], "asks for 5 devices"),
    ],
)
async def test_bad_requests_change_nothing(
    tmp_path: Path, requests: list[list[str]], message: str
) -> None:
    alloc = allocator(tmp_path)
    with pytest.raises(AllocateRejected) as info:
        await alloc.allocate(requests)
    assert message in str(info.value)
    assert dirs_in(tmp_path / "memif") == []
    assert alloc.allocations() == []
    assert not Path(alloc.settings.checkpoint).exists()


async def test_checkpoint_failure_rolls_back_the_whole_call(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    alloc = allocator(tmp_path, checkpoint=blocker / "cp.json")
    with pytest.raises(CheckpointWriteError):
        await alloc.allocate([["memif-0"], ["memif-1"]])
    assert alloc.allocations() == []
    assert dirs_in(tmp_path / "memif") == []


async def test_dir_failure_rolls_back_the_whole_call(tmp_path: Path) -> None:
    alloc = allocator(tmp_path)
    # The memif dir replaced by a file: no grant dir can be created in it.
    os.rmdir(tmp_path / "memif")
    (tmp_path / "memif").write_text("")
    with pytest.raises(DevicesUnavailable, match="cannot create memif dir"):
        await alloc.allocate([["memif-0"], ["memif-1"]])
    assert alloc.allocations() == []
    saved = CheckpointStore(alloc.settings.checkpoint).load()
    assert saved is not None and saved.allocations == ()
    # Nothing is held: the same devices can be granted once the dir is back.
    (tmp_path / "memif").unlink()
    (tmp_path / "memif").mkdir()
    assert len(await alloc.allocate([["memif-0"], ["memif-1"]])) == 2


async def test_unhealthy_devices_refuse_grants(tmp_path: Path) -> None:
    alloc = allocator(tmp_path)
    alloc.set_healthy(False)
    assert {health for _, health in alloc.devices()} == {"Unhealthy"}
    with pytest.raises(DevicesUnavailable, match="not usable"):
        await alloc.allocate([["memif-0"]])


async def test_stale_grant_of_a_reassigned_device_is_replaced(tmp_path: Path) -> None:
    alloc = allocator(tmp_path)
    (old,) = await alloc.allocate([["memif-0", "memif-1"]])
    (new,) = await alloc.allocate([["memif-1"]])
    assert not Path(old.info.host_dir).exists()
    assert Path(new.info.host_dir).is_dir()
    assert [a.devices for a in alloc.allocations()] == [("memif-1",)]
    assert alloc.superseded == 1


async def test_shrinking_capacity_keeps_granted_devices_listed_unhealthy(tmp_path: Path) -> None:
    alloc = allocator(tmp_path, devices=4)
    (grant,) = await alloc.allocate([["memif-3"]])
    version = alloc.version
    alloc.set_capacity(2)
    assert alloc.version > version
    assert alloc.devices() == [
        ("memif-0", "Healthy"),
        ("memif-1", "Healthy"),
        ("memif-3", "Unhealthy"),
    ]
    await alloc.release([grant.allocation.id], reason="test")
    assert [d for d, _ in alloc.devices()] == ["memif-0", "memif-1"]


def test_preferred_takes_must_include_then_free_devices_in_index_order(tmp_path: Path) -> None:
    alloc = allocator(tmp_path, devices=12)
    assert alloc.preferred(["memif-10", "memif-2", "memif-7"], [], 2) == ["memif-2", "memif-7"]
    assert alloc.preferred(["memif-10", "memif-2", "memif-7"], ["memif-10"], 2) == [
        "memif-10",
        "memif-2",
    ]


async def test_preferred_puts_devices_we_still_hold_last(tmp_path: Path) -> None:
    alloc = allocator(tmp_path, devices=4)
    await alloc.allocate([["memif-0"]])
    assert alloc.preferred(["memif-0", "memif-1", "memif-2"], [], 2) == ["memif-1", "memif-2"]


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        (["memif-0"], ["memif-1"], 1, "must-include device 'memif-1' is not available"),
        (["memif-0", "memif-1"], [], 3, "allocation_size 3 must be between 1 and the 2"),
        (["memif-0"], [], 0, "allocation_size 0"),
        (["memif-0", "memif-1"], ["memif-0", "memif-1"], 1, "exceed allocation_size 1"),
        (["memif-0", "nope"], [], 1, "unknown device id 'nope'"),
        (["memif-0", "memif-0"], [], 1, "listed more than once"),
    ],
)
def test_preferred_rejects_bad_requests(
    tmp_path: Path, available: list[str], must: list[str], size: int, message: str
) -> None:
    with pytest.raises(AllocateRejected) as info:
        allocator(tmp_path).preferred(available, must, size)
    assert message in str(info.value)


def test_restore_refuses_a_checkpoint_of_another_configuration(tmp_path: Path) -> None:
    from podwire.deviceplugin.checkpoint import CheckpointData

    alloc = allocator(tmp_path)
    with pytest.raises(CheckpointIncompatible, match="configured memif_host_dir"):
        alloc.restore(CheckpointData("podwire.io/memif", "/elsewhere", ()))
    with pytest.raises(CheckpointIncompatible, match="configured resource"):
        alloc.restore(CheckpointData("other.io/x", alloc.settings.memif_host_dir, ()))


def test_reconcile_plan() -> None:
    pod = PodName("ns", "a")
    live = Allocation("a" * 20, ("memif-0",), "s" * 24, 0.0)
    bound = Allocation("b" * 20, ("memif-1",), "s" * 24, 0.0, pod)
    young = Allocation("c" * 20, ("memif-2",), "s" * 24, 95.0)
    dead = Allocation("d" * 20, ("memif-3",), "s" * 24, 10.0)
    busy = Allocation("e" * 20, ("memif-4",), "s" * 24, 0.0)
    decided = plan(
        [live, bound, young, dead, busy],
        {"memif-0": pod, "memif-1": pod},
        now=100.0,
        grace=30.0,
        busy={busy.id},
    )
    assert decided.bind == {live.id: pod}
    assert decided.release == (dead.id,)
    assert decided.kept_young == 1
