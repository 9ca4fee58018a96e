"""``podwire agent``: not built yet; the subcommand exists so its module can grow in place."""

from __future__ import annotations

import argparse

from podwire.errors import PermanentError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("agent", help="(not built yet)")
    parser.add_argument("--config", required=True)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    raise PermanentError("podwire agent is not built yet")
