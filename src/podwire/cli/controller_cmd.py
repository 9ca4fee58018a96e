"""``podwire controller --config FILE``: the pool controller (VIF API, admin API, pools)."""

from __future__ import annotations

import argparse
import asyncio

from podwire.config import Settings, load_settings
from podwire.errors import ConfigError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("controller", help="run the port pool controller")
    parser.add_argument("--config", required=True)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from podwire.log import setup_logging

    settings = load_settings(args.config)
    if not settings.controller.admin_token or not settings.controller.node_tokens:
        raise ConfigError("controller.admin_token and controller.node_tokens are required")
    setup_logging(settings.log)
    asyncio.run(_serve(settings))
    return 0


async def _serve(settings: Settings) -> None:
    from podwire.controller.app import Controller
    from podwire.etcd.client import EtcdClient
    from podwire.neutron.client import connect

    namespace = settings.deployment.etcd_namespace
    etcd = await EtcdClient.connect(
        settings.etcd, check=False, namespace=namespace
    )  # the election waits
    try:
        await Controller(settings, etcd, connect(settings.neutron)).run()
    finally:
        await etcd.close()
