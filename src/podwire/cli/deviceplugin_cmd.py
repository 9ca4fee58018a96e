"""``podwire device-plugin``: the kubelet memif device plugin on its own, outside the agent.

Settings come from ``[deviceplugin]`` in ``--config`` (plus ``PODWIRE_DEVICEPLUGIN_*`` env);
each flag overrides its key. SIGHUP re-reads both and applies what can change live (the number
of devices); SIGTERM/SIGINT stop the plugin and remove its socket.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
from typing import Any

from podwire.config import DevicePluginSettings, LogSettings, build_section, load_settings
from podwire.errors import PodwireError

# flag -> settings key; every key of DevicePluginSettings except `enabled`, which only tells
# the agent whether to embed the plugin.
FLAGS: dict[str, str] = {
    "--device-plugins-dir": "device_plugins_dir",
    "--pod-resources-socket": "pod_resources_socket",
    "--memif-host-dir": "memif_host_dir",
    "--memif-container-dir": "memif_container_dir",
    "--checkpoint": "checkpoint",
    "--resource-name": "resource_name",
    "--devices": "devices",
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "device-plugin",
        help="run the kubelet memif device plugin standalone",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE", help="podwire TOML config file")
    defaults = DevicePluginSettings()
    for flag, key in FLAGS.items():
        kind = int if key == "devices" else str
        parser.add_argument(
            flag,
            dest=key,
            type=kind,
            metavar="N" if kind is int else "PATH" if key != "resource_name" else "NAME",
            help=f"overrides deviceplugin.{key} (default {getattr(defaults, key)})",
        )
    parser.set_defaults(handler=run)


def resolve(args: argparse.Namespace) -> tuple[LogSettings, DevicePluginSettings]:
    """Config file and env first, flags on top; validated as one section."""
    settings = load_settings(args.config)
    raw = dataclasses.asdict(settings.deviceplugin)
    for key in FLAGS.values():
        value = getattr(args, key, None)
        if value is not None:
            raw[key] = value
    section: DevicePluginSettings = build_section(DevicePluginSettings, raw, "deviceplugin")
    return settings.log, section


def run(args: argparse.Namespace) -> int:
    from podwire.log import setup_logging

    log_settings, settings = resolve(args)
    setup_logging(log_settings)
    asyncio.run(_serve(args, settings))
    return 0


async def _serve(args: argparse.Namespace, settings: DevicePluginSettings) -> None:
    from podwire.deviceplugin import DevicePlugin
    from podwire.log import get_logger

    log = get_logger("podwire.cli.device-plugin")
    plugin = DevicePlugin(settings)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def reload() -> None:
        try:
            plugin.reload(resolve(args)[1])
        except PodwireError as exc:
            log.error("deviceplugin.reload.failed", error=str(exc))

    loop.add_signal_handler(signal.SIGHUP, reload)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await plugin.run()
    except asyncio.CancelledError:
        log.info("deviceplugin.stopped")
    finally:
        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
