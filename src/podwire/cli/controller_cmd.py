"""``podwire controller``: not built yet; the subcommand exists so its module can grow in place."""

from __future__ import annotations

import argparse

from podwire.errors import PermanentError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("controller", help="(not built yet)")
    parser.add_argument("--config", required=True)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    raise PermanentError("podwire controller is not built yet")
