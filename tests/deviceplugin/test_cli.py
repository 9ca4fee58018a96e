"""``podwire device-plugin``: flags over the file, and the real process under signals."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import pytest

from podwire.cli import deviceplugin_cmd
from podwire.errors import ConfigError
from tests.kubelet_peer import KubeletPeer


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    deviceplugin_cmd.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["device-plugin", *argv])


def write_config(path: Path, root: Path, devices: int) -> None:
    path.write_text(
        "[deviceplugin]\n"
        f"devices = {devices}\n"
        f'device_plugins_dir = "{root / "device-plugins"}"\n'
        f'pod_resources_socket = "{root / "pod-resources" / "kubelet.sock"}"\n'
        f'memif_host_dir = "{root / "memif"}"\n'
        f'checkpoint = "{root / "state" / "cp.json"}"\n'
        '[log]\nformat = "json"\n'
    )


def test_flags_override_the_file(tmp_path: Path) -> None:
    config = tmp_path / "podwire.toml"
    write_config(config, tmp_path, devices=5)
    _, settings = deviceplugin_cmd.resolve(parse("--config", str(config)))
    assert settings.devices == 5
    assert settings.memif_host_dir == str(tmp_path / "memif")
    _, settings = deviceplugin_cmd.resolve(
        parse(
            "--config",
            str(config),
            "--devices",
            "9",
            "--memif-host-dir",
            "/srv/memif",
            "--resource-name",
            "example.com/memif",
            "--checkpoint",
            "/srv/cp.json",
            "--device-plugins-dir",
            "/srv/dp",
            "--pod-resources-socket",
            "/srv/pr.sock",
            "--memif-container-dir",
            "/run/memif",
        )
    )
    assert (settings.devices, settings.memif_host_dir, settings.resource_name) == (
        9,
        "/srv/memif",
        "example.com/memif",
    )
    assert (settings.checkpoint, settings.device_plugins_dir) == ("/srv/cp.json", "/srv/dp")
    assert (settings.pod_resources_socket, settings.memif_container_dir) == (
        "/srv/pr.sock",
        "/run/memif",
    )


def test_bad_flag_values_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"deviceplugin\.devices: must be between 1 and 100000"):
        deviceplugin_cmd.resolve(parse("--devices", "0"))
    with pytest.raises(ConfigError, match=r"deviceplugin\.memif_host_dir: must be an absolute"):
        deviceplugin_cmd.resolve(parse("--memif-host-dir", "relative"))


async def run_cli(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "podwire.cli.main",
        "device-plugin",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PYTHONPATH": str(Path(deviceplugin_cmd.__file__).parents[2])},
    )


async def test_start_up_error_is_one_line_and_exit_code_2(short_root: Path) -> None:
    process = await run_cli("--device-plugins-dir", str(short_root / "absent"))
    async with asyncio.timeout(30):
        _, stderr = await process.communicate()
    assert process.returncode == 2
    lines = stderr.decode().strip().splitlines()
    assert lines == [
        f"podwire device-plugin: error: deviceplugin.device_plugins_dir: {short_root / 'absent'}"
        " does not exist or is not a directory; is kubelet running on this node with its root"
        " dir at the expected place?"
    ]


async def test_process_registers_reloads_on_sighup_and_stops_on_sigterm(
    kubelet: KubeletPeer, short_root: Path
) -> None:
    config = short_root / "podwire.toml"
    write_config(config, short_root, devices=3)
    process = await run_cli("--config", str(config))
    try:
        async with asyncio.timeout(30):
            event = await kubelet.register_events.get()
        assert event.request.endpoint == "podwire-memif.sock"
        await kubelet.wait_devices(lambda d: len(d) == 3)
        write_config(config, short_root, devices=6)
        process.send_signal(signal.SIGHUP)
        await kubelet.wait_devices(lambda d: len(d) == 6)
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
        assert not (kubelet.plugins_dir / "podwire-memif.sock").exists()
        assert b'"event": "deviceplugin.registered"' in stderr
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
