"""``podwire neutron-agent dhcp|l3``: Neutron's own agents for a host of the local stack."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from podwire.config import LogSettings
from podwire.errors import ConfigError
from podwire.log import setup_logging
from podwire.stack.agent_conf import AGENT_INIS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "neutron-agent", help="run one of Neutron's agents for a host of the local stack"
    )
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind in AGENT_INIS:
        agent = kinds.add_parser(
            kind, help=f"neutron-{kind}-agent with interface_driver = podwire, until SIGTERM/SIGINT"
        )
        agent.add_argument("--data-dir", required=True, type=Path, help="a stack up --rpc data dir")
        agent.add_argument("--host", required=True, help="the agent's host (binding:host_id)")
        agent.add_argument(
            "--netns",
            default="",
            help="the simulated host's network namespace (tap ends go there)",
        )
        agent.add_argument(
            "--adopt-timeout",
            type=float,
            default=10.0,
            help="seconds a plug waits for podwire's node agent to adopt the tap",
        )
        agent.add_argument("--log-level", default="WARNING")
        agent.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from podwire.stack.neutron_agent import AgentOptions, run_agent

    if not 0 <= args.adopt_timeout <= 600:
        raise ConfigError("--adopt-timeout: must be between 0 and 600 seconds")
    setup_logging(LogSettings(level=args.log_level.upper()))
    options = AgentOptions(
        kind=args.kind,
        data_dir=args.data_dir,
        host=args.host,
        netns=args.netns,
        adopt_timeout=args.adopt_timeout,
    )

    def announce(info: dict[str, Any]) -> None:
        print(json.dumps(info))
        sys.stdout.flush()

    return run_agent(options, announce)
