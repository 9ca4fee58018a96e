"""``podwire agent --config FILE``: the node agent (binder, CNI server, heartbeat, device plugin).

SIGTERM/SIGINT stop it cleanly: the CNI socket closes and the heartbeat lease is revoked, so
Neutron stops binding ports to this node at once instead of after the TTL.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from podwire.config import load_settings
from podwire.log import setup_logging


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("agent", help="run the node agent")
    parser.add_argument("--config", required=True, help="podwire TOML file")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    setup_logging(settings.log)
    asyncio.run(_serve(args.config))
    return 0


async def _serve(config: str) -> None:
    from podwire.agent.app import Agent

    agent = Agent(load_settings(config))
    task = asyncio.create_task(agent.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise
