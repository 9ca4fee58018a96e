"""``podwire memif build``: compile the per-pod memif master (the set-up script runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from podwire.memif.build import build


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("memif", help="memif master helpers")
    verbs = parser.add_subparsers(dest="memif_command", required=True, metavar="VERB")
    make = verbs.add_parser("build", help="compile podwire-memif with gcc/cc")
    make.add_argument("--output", required=True, type=Path, help="path of the executable")
    make.set_defaults(handler=run_build)


def run_build(args: argparse.Namespace) -> int:
    print(f"built {build(args.output)}")
    return 0
