"""``podwire status``: the state of every part on one screen (``--json`` for scripts)."""

from __future__ import annotations

import argparse
import asyncio
import json

from podwire.config import load_settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("status", help="show nodes, forwarder, feedback and leaders")
    parser.add_argument("--config", help="podwire TOML file (etcd endpoints); env overrides")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from podwire.status.render import render
    from podwire.status.report import collect

    report = asyncio.run(collect(load_settings(args.config)))
    print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
    return 0 if report.etcd.get("state") == "ok" else 1
