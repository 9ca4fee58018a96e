"""``podwire cni install`` (plugin and conflist where the runtime looks) and ``cni build``."""

from __future__ import annotations

import argparse
from pathlib import Path

from podwire.cni.build import build
from podwire.cni.install import DEFAULT_CNI_VERSION, InstallSpec, install
from podwire.config import AGENT_SOCKET


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("cni", help="CNI plugin helpers")
    verbs = parser.add_subparsers(dest="cni_command", required=True, metavar="VERB")
    add = verbs.add_parser("install", help="install the plugin binary and a network config")
    add.add_argument("--bin-dir", required=True, type=Path, help="runtime's CNI bin dir")
    add.add_argument("--conf-dir", required=True, type=Path, help="runtime's CNI conf dir")
    add.add_argument("--network", default="podwire", help="Neutron network id or name")
    add.add_argument("--name", default="podwire", help="CNI network name")
    add.add_argument("--project", default="", help="Neutron project id (optional)")
    add.add_argument("--security-group", action="append", default=[], dest="security_groups")
    add.add_argument("--agent-socket", default=AGENT_SOCKET)
    add.add_argument("--chain", action="append", default=[], help="plugin to chain after podwire")
    add.add_argument(
        "--binary", type=Path, default=None, help="plugin to install (default: the built one)"
    )
    add.add_argument(
        "--cni-version",
        default=DEFAULT_CNI_VERSION,
        help="the conflist's cniVersion (1.1.0 adds STATUS and GC; containerd 1.6 reads <= 1.0.0)",
    )
    add.set_defaults(handler=run_install)
    make = verbs.add_parser("build", help="build the plugin (C with gcc/cc, else the Python one)")
    make.add_argument("--output", required=True, type=Path, help="path of the executable")
    make.set_defaults(handler=run_build)


def run_install(args: argparse.Namespace) -> int:
    plugin, conf = install(
        InstallSpec(
            bin_dir=args.bin_dir,
            conf_dir=args.conf_dir,
            network=args.network,
            name=args.name,
            project=args.project,
            security_groups=args.security_groups,
            agent_socket=args.agent_socket,
            chain=args.chain,
            binary=args.binary,
            cni_version=args.cni_version,
        )
    )
    print(f"installed {plugin.path} ({plugin.how}) and {conf}")
    return 0


def run_build(args: argparse.Namespace) -> int:
    plugin = build(args.output)
    print(f"built {plugin.path} ({plugin.how})")
    return 0
