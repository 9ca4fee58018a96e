"""``podwire config check FILE``: a config validated exactly as the services read it;
``podwire config reference``: every key, as docs/configuration.md lists it.

For a ConfigMap or a config management run: every problem on a line of its own (not only the
first, as a service's start-up reports), exit 2 when there is any, 0 and nothing when there is
none. Environment overrides (``PODWIRE_<SECTION>_<KEY>``) are left out unless ``--with-env``:
the file is what is being checked.
"""

from __future__ import annotations

import argparse
import os
import sys

from podwire.cli.config_reference import render
from podwire.config import config_problems


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("config", help="configuration helpers")
    verbs = parser.add_subparsers(dest="config_command", required=True, metavar="VERB")
    check = verbs.add_parser("check", help="validate a config file as the services do")
    check.add_argument("file", help="the TOML config file")
    check.add_argument(
        "--with-env", action="store_true", help="apply PODWIRE_* environment overrides too"
    )
    check.set_defaults(handler=run_check)
    reference = verbs.add_parser(
        "reference", help="print every setting with its type, default and meaning (Markdown)"
    )
    reference.set_defaults(handler=run_reference)


def run_check(args: argparse.Namespace) -> int:
    problems = config_problems(args.file, os.environ if args.with_env else None)
    for problem in problems:
        print(f"{args.file}: {problem}", file=sys.stderr)
    return 2 if problems else 0


def run_reference(args: argparse.Namespace) -> int:
    sys.stdout.write(render())
    return 0
