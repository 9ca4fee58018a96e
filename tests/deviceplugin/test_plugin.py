"""The plugin against a kubelet peer over real unix sockets: every RPC, restarts, cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from podwire.deviceplugin import DevicePlugin
from podwire.deviceplugin.api import dp
from podwire.deviceplugin.checkpoint import CheckpointIncompatible
from podwire.deviceplugin.model import PodName
from podwire.deviceplugin.podresources import PodResourcesNotSynced
from podwire.deviceplugin.registration import RegistrationRejected
from podwire.errors import ConfigError, ValidationError
from tests.kubelet_peer import KubeletPeer, allocate_request

from .conftest import StartPlugin, dirs_in, make_settings


async def eventually(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


def checkpoint_of(root: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((root / "state" / "memif-checkpoint.json").read_text())
    return doc


async def test_registers_only_once_serving_with_kubelet_api_fields(
    kubelet: KubeletPeer, start_plugin: StartPlugin
) -> None:
    running = await start_plugin()
    (event,) = kubelet.registrations
    assert event.answered_during_register
    assert event.request.version == "v1beta1"
    assert event.request.endpoint == "podwire-memif.sock"
    assert event.request.resource_name == "podwire.io/memif"
    assert event.request.options.get_preferred_allocation_available
    assert not event.request.options.pre_start_required
    socket = kubelet.plugins_dir / "podwire-memif.sock"
    assert stat.S_ISSOCK(os.lstat(socket).st_mode)
    assert stat.S_IMODE(os.lstat(socket).st_mode) == 0o600
    assert running.plugin.stats()["registrations"] == 1


async def test_list_and_watch_sends_all_devices_then_every_change(
    kubelet: KubeletPeer, start_plugin: StartPlugin
) -> None:
    running = await start_plugin(devices=3)
    devices = await kubelet.wait_devices(lambda d: len(d) == 3)
    assert [(d.ID, d.health) for d in devices] == [
        ("memif-0", "Healthy"),
        ("memif-1", "Healthy"),
        ("memif-2", "Healthy"),
    ]
    plugin = running.plugin
    plugin.reload(make_settings(Path(plugin.settings.device_plugins_dir).parent, devices=5))
    devices = await kubelet.wait_devices(lambda d: len(d) == 5)
    assert devices[-1].ID == "memif-4"
    # Health: the memif host dir disappears -> all devices unhealthy on the next check.
    os.rmdir(plugin.settings.memif_host_dir)
    plugin._check_health()
    await kubelet.wait_devices(lambda d: all(x.health == "Unhealthy" for x in d))


async def test_reload_refuses_settings_that_need_a_restart(
    kubelet: KubeletPeer, start_plugin: StartPlugin, short_root: Path
) -> None:
    running = await start_plugin()
    with pytest.raises(ConfigError, match=r"deviceplugin\.memif_host_dir: cannot change"):
        running.plugin.reload(make_settings(short_root, memif_host_dir="/other"))


async def test_options_prestart_and_preferred(
    kubelet: KubeletPeer, start_plugin: StartPlugin
) -> None:
    await start_plugin(devices=6)
    stub = kubelet.stub
    options = await stub.GetDevicePluginOptions(dp.Empty())
    assert options.get_preferred_allocation_available and not options.pre_start_required
    assert await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["memif-0"])) == (
        dp.PreStartContainerResponse()
    )
    await stub.Allocate(allocate_request(["memif-0"]))
    response = await stub.GetPreferredAllocation(
        dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["memif-5", "memif-0", "memif-3", "memif-1"],
                    must_include_deviceIDs=["memif-5"],
                    allocation_size=3,
                )
            ]
        )
    )
    assert list(response.container_responses[0].deviceIDs) == ["memif-5", "memif-1", "memif-3"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetPreferredAllocation(
            dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=["memif-0"],
                        must_include_deviceIDs=["memif-4"],
                        allocation_size=1,
                    )
                ]
            )
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "container_requests[0]: preferred allocation: must-include device 'memif-4'" in str(
        info.value.details()
    )


async def test_allocate_gives_each_container_its_own_dir_secret_env_and_mount(
    kubelet: KubeletPeer, start_plugin: StartPlugin, short_root: Path
) -> None:
    running = await start_plugin()
    response = await kubelet.stub.Allocate(allocate_request(["memif-0", "memif-1"], ["memif-2"]))
    first, second = response.container_responses
    for container in (first, second):
        assert container.envs["MEMIF_SOCKET"] == "/run/vpp/memif.sock"
        assert len(container.envs["MEMIF_SECRET"]) == 24
        (mount,) = container.mounts
        assert mount.container_path == "/run/vpp"
        assert Path(mount.host_path).parent == short_root / "memif"
        assert Path(mount.host_path).is_dir()
    assert first.mounts[0].host_path != second.mounts[0].host_path
    assert first.envs["MEMIF_SECRET"] != second.envs["MEMIF_SECRET"]
    saved = checkpoint_of(short_root)
    assert sorted(tuple(a["devices"]) for a in saved["allocations"]) == [
        ("memif-0", "memif-1"),
        ("memif-2",),
    ]
    assert {a["secret"] for a in saved["allocations"]} == {
        first.envs["MEMIF_SECRET"],
        second.envs["MEMIF_SECRET"],
    }
    assert running.plugin.stats()["allocations"] == 2


@pytest.mark.parametrize(
    ("containers", "message"),
    [
        ((), "empty request: no container_requests"),
        ((["memif-0"], []), "container_requests[1] has no devices_ids"),
        ((["memif-0", "memif-99"],), "unknown device id 'memif-99'"),
        ((["memif-0"], ["memif-0"]), "device id 'memif-0' is listed more than once"),
        ((["memif-0", "memif-1", "memif-2", "memif-3", "memif-4"],), "has only 4"),
    ],
)
async def test_bad_allocate_is_invalid_argument_and_allocates_nothing(
    kubelet: KubeletPeer,
    start_plugin: StartPlugin,
    short_root: Path,
    containers: tuple[list[str], ...],
    message: str,
) -> None:
    running = await start_plugin(devices=4)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await kubelet.stub.Allocate(allocate_request(*containers))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in str(info.value.details())
    assert dirs_in(short_root / "memif") == []
    assert checkpoint_of(short_root)["allocations"] == []
    assert running.plugin.stats()["allocate_errors"] == 1


async def test_200_concurrent_allocations_get_unique_dirs_and_secrets(
    kubelet: KubeletPeer, start_plugin: StartPlugin, short_root: Path
) -> None:
    await start_plugin(devices=200)
    responses = await asyncio.gather(
        *(kubelet.stub.Allocate(allocate_request([f"memif-{i}"])) for i in range(200))
    )
    containers = [r.container_responses[0] for r in responses]
    dirs = {c.mounts[0].host_path for c in containers}
    secrets = {c.envs["MEMIF_SECRET"] for c in containers}
    assert len(dirs) == 200 and len(secrets) == 200
    assert sorted(dirs_in(short_root / "memif")) == sorted(Path(d).name for d in dirs)
    saved = checkpoint_of(short_root)["allocations"]
    assert {a["secret"] for a in saved} == secrets


async def test_pod_deletion_removes_dir_and_socket(
    kubelet: KubeletPeer, start_plugin: StartPlugin, short_root: Path
) -> None:
    running = await start_plugin()
    plugin = running.plugin
    one = (await kubelet.stub.Allocate(allocate_request(["memif-1"]))).container_responses[0]
    two = (await kubelet.stub.Allocate(allocate_request(["memif-2"]))).container_responses[0]
    kubelet.pods = {PodName("default", "one"): ["memif-1"], PodName("default", "two"): ["memif-2"]}
    # The agent's CNI ADD learns the pod's memif; VPP then creates the socket in the dir.
    (info,) = await plugin.pod_memif("default", "one")
    assert info.host_dir == one.mounts[0].host_path
    assert info.secret == one.envs["MEMIF_SECRET"]
    Path(info.host_socket).write_text("")  # stands for VPP's listening socket file
    assert await plugin.release_pod("default", "one") == 1
    assert not Path(one.mounts[0].host_path).exists()
    assert await plugin.release_pod("default", "one") == 0
    # Not learned before: found through kubelet's Get ... or its List when Get is disabled.
    kubelet.get_enabled = False
    assert await plugin.release_pod("default", "two") == 1
    assert not Path(two.mounts[0].host_path).exists()
    assert checkpoint_of(short_root)["allocations"] == []
    assert plugin.stats()["releases"] == 2
    with pytest.raises(ValidationError, match="invalid pod reference"):
        await plugin.release_pod("default", "../etc")


async def test_plugin_restart_keeps_live_grants_and_cleans_the_rest(
    kubelet: KubeletPeer, start_plugin: StartPlugin, short_root: Path
) -> None:
    first = await start_plugin()
    live = (await kubelet.stub.Allocate(allocate_request(["memif-0"]))).container_responses[0]
    gone = (await kubelet.stub.Allocate(allocate_request(["memif-1"]))).container_responses[0]
    kubelet.pods = {PodName("ns", "live"): ["memif-0"]}
    await first.stop()
    assert not (kubelet.plugins_dir / "podwire-memif.sock").exists()
    stray = short_root / "memif" / ("f" * 20)  # a dir no checkpoint knows: left alone
    stray.mkdir()

    second = await start_plugin(reconcile_grace=0.0)
    assert len(kubelet.registrations) == 2
    assert Path(live.mounts[0].host_path).is_dir()
    assert not Path(gone.mounts[0].host_path).exists()
    assert stray.is_dir()
    (kept,) = second.plugin.allocator.allocations()
    assert kept.devices == ("memif-0",)
    assert kept.pod == PodName("ns", "live")
    assert kept.secret == live.envs["MEMIF_SECRET"]
    # The new process serves on: the kept grant is untouched by a new one.
    await kubelet.stub.Allocate(allocate_request(["memif-2"]))
    assert Path(live.mounts[0].host_path).is_dir()


async def test_a_kubelet_listing_no_pod_at_all_costs_no_grant(
    kubelet: KubeletPeer, start_plugin: StartPlugin
) -> None:
    """A kubelet that has just started lists no pod until it has them from the apiserver
    (tests/kube: about 1 s): that is no proof that the pods holding grants are gone."""
    plugin = (await start_plugin(reconcile_grace=0.0)).plugin
    assert (await plugin.reconcile()).release == ()  # nothing held: an empty list is fine
    held = (await kubelet.stub.Allocate(allocate_request(["memif-0"]))).container_responses[0]
    with pytest.raises(PodResourcesNotSynced, match=r"no pod at all .* the 1 grants are kept"):
        await plugin.reconcile()
    assert Path(held.mounts[0].host_path).is_dir()
    kubelet.pods = {PodName("ns", "other"): []}  # kubelet lists pods, none holds memif-0
    assert len((await plugin.reconcile()).release) == 1
    assert not Path(held.mounts[0].host_path).exists()


async def test_kubelet_restart_reregisters_without_losing_grants(
    kubelet: KubeletPeer, start_plugin: StartPlugin, short_root: Path
) -> None:
    running = await start_plugin(devices=4)
    before = (await kubelet.stub.Allocate(allocate_request(["memif-0"]))).container_responses[0]
    await kubelet.register_events.get()
    await kubelet.restart()
    async with asyncio.timeout(10):
        event = await kubelet.register_events.get()
    assert event.answered_during_register
    await eventually(lambda: running.plugin.registered)
    assert running.plugin.stats()["kubelet_restarts"] == 1
    assert (kubelet.plugins_dir / "podwire-memif.sock").exists()
    await kubelet.wait_devices(lambda d: len(d) == 4)
    after = (await kubelet.stub.Allocate(allocate_request(["memif-1"]))).container_responses[0]
    assert Path(before.mounts[0].host_path).is_dir()
    assert Path(after.mounts[0].host_path).is_dir()
    assert len(checkpoint_of(short_root)["allocations"]) == 2


async def test_plugin_waits_for_a_kubelet_that_is_not_up_yet(
    short_root: Path, start_plugin: StartPlugin
) -> None:
    fake = KubeletPeer(short_root, "podwire.io/memif")
    running = await start_plugin(wait=False)
    try:
        await eventually(lambda: running.plugin.stats()["registration_failures"] > 0)
        assert not running.plugin.registered
        await fake.start()
        await running.plugin.wait_registered()
        assert len(fake.registrations) == 1
    finally:
        await running.stop()
        await fake.stop()


async def test_refused_registration_ends_the_run(
    kubelet: KubeletPeer, start_plugin: StartPlugin
) -> None:
    kubelet.reject_with = "resource podwire.io/memif is already registered"
    with pytest.raises(RegistrationRejected, match="already registered"):
        await start_plugin()


async def test_corrupt_checkpoint_is_set_aside_and_the_plugin_starts(
    kubelet: KubeletPeer, start_plugin: StartPlugin, short_root: Path, caplog: Any
) -> None:
    (short_root / "state").mkdir()
    checkpoint = short_root / "state" / "memif-checkpoint.json"
    checkpoint.write_text('{"v": 1, "resource_name": "podwire.io/memif", "allocati')
    orphan = short_root / "memif" / ("a" * 20)
    orphan.mkdir(parents=True)
    running = await start_plugin()
    plugin = running.plugin
    assert plugin.stats()["checkpoint_recoveries"] == 1
    (logged,) = [r for r in caplog.records if r.getMessage() == "deviceplugin.checkpoint.corrupt"]
    assert "not valid JSON" in logged.fields["error"]  # type: ignore[attr-defined]
    (moved,) = (short_root / "state").glob("memif-checkpoint.json.corrupt-*")
    assert moved.read_text().endswith("allocati")
    assert orphan.is_dir()
    assert checkpoint_of(short_root)["allocations"] == []
    await kubelet.stub.Allocate(allocate_request(["memif-0"]))
    assert len(checkpoint_of(short_root)["allocations"]) == 1


async def test_newer_checkpoint_stops_start_up(kubelet: KubeletPeer, short_root: Path) -> None:
    (short_root / "state").mkdir()
    (short_root / "state" / "memif-checkpoint.json").write_text('{"v": 7}')
    with pytest.raises(CheckpointIncompatible, match="schema v=7 was written by a newer podwire"):
        await DevicePlugin(make_settings(short_root)).run()
    assert kubelet.registrations == []


async def test_missing_device_plugins_dir_is_a_clear_start_up_error(short_root: Path) -> None:
    plugin = DevicePlugin(make_settings(short_root, device_plugins_dir=str(short_root / "nope")))
    with pytest.raises(ConfigError) as info:
        await plugin.run()
    assert str(info.value).startswith(
        f"deviceplugin.device_plugins_dir: {short_root / 'nope'} does not exist"
    )


async def test_too_long_socket_path_is_a_clear_start_up_error(short_root: Path) -> None:
    deep = short_root / ("d" * 100)
    deep.mkdir()
    with pytest.raises(ConfigError, match="longer than 107 bytes"):
        await DevicePlugin(make_settings(short_root, device_plugins_dir=str(deep))).run()
