"""``podwire stack up|down``: the embedded local stack."""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from pathlib import Path
from typing import Any

from podwire.config import LogSettings
from podwire.errors import ConfigError, ValidationError
from podwire.log import setup_logging
from podwire.schema.deployment import deployments


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("stack", help="run the local etcd + MariaDB + Neutron stack")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start the stack and stay in the foreground")
    up.add_argument("--data-dir", required=True, type=Path)
    up.add_argument("--workers", type=int, default=2, help="Neutron API worker processes")
    up.add_argument("--ready-timeout", type=float, default=120.0)
    up.add_argument("--log-level", default="WARNING")
    up.add_argument(
        "--etcd-auth",
        action="store_true",
        help="etcd with authentication; secrets in DATA_DIR/etcd-auth/",
    )
    up.add_argument(
        "--etcd-members",
        type=int,
        default=1,
        choices=(1, 3, 5),
        help="etcd cluster members on loopback (stack.json: etcd_endpoints)",
    )
    up.add_argument(
        "--neutron-servers",
        type=int,
        default=1,
        help="neutron-server processes on the same database, each a forwarder candidate",
    )
    up.add_argument(
        "--rpc",
        action="store_true",
        help="also a private RabbitMQ and neutron-rpc-server, for Neutron's DHCP and L3 agents"
        " (stack.json: transport_url)",
    )
    up.add_argument(
        "--deployments",
        default="podwire",
        metavar="NAMES",
        help="comma-separated podwire deployments Neutron's ml2 driver serves (default podwire)",
    )
    up.add_argument(
        "--kubernetes",
        action="store_true",
        help="also kube-apiserver (on the stack's etcd), kube-controller-manager and"
        " kube-scheduler; stack.json: kube_apiserver, kubeconfig (admin), kube_bin_dir",
    )
    up.add_argument(
        "--kube-bin-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the Kubernetes binaries are (default: the venv's share/podwire-kube,"
        " built by scripts/setup)",
    )
    up.add_argument(
        "--kube-address",
        default="",
        metavar="ADDR",
        help="the address the apiserver advertises (default: this machine's default-route"
        " address; it listens on all)",
    )
    up.set_defaults(handler=_up)
    down = actions.add_parser("down", help="stop the stack running on a data dir")
    down.add_argument("--data-dir", required=True, type=Path)
    down.set_defaults(handler=_down)


def _up(args: argparse.Namespace) -> int:
    from podwire.stack.runner import Stack, StackOptions

    if not 1 <= args.workers <= 16:
        raise ConfigError("--workers: must be between 1 and 16")
    if not 1 <= args.neutron_servers <= 4:
        raise ConfigError("--neutron-servers: must be between 1 and 4")
    setup_logging(LogSettings(level=args.log_level.upper()))
    options = StackOptions(
        args.data_dir,
        args.workers,
        args.ready_timeout,
        args.etcd_auth,
        etcd_members=args.etcd_members,
        neutron_servers=args.neutron_servers,
        rpc=args.rpc,
        deployments=_deployments(args.deployments),
        kubernetes=args.kubernetes,
        kube_bin_dir=args.kube_bin_dir,
        kube_address=_kube_address(args.kube_address),
    )
    stack = Stack(options)

    def announce(info: dict[str, Any]) -> None:
        shown = (
            "etcd",
            "etcd_endpoints",
            "etcd_auth",
            "neutron",
            "neutron_servers",
            "kube_apiserver",
            "kubeconfig",
            "data_dir",
            "ready_seconds",
        )
        print(json.dumps({k: info[k] for k in (*shown, "transport_url") if k in info}))
        sys.stdout.flush()

    return stack.run(announce)


def _kube_address(address: str) -> str:
    if address and not _is_unicast_ipv4(address):
        raise ConfigError(f"--kube-address: {address!r} is not a non-loopback IPv4 address")
    return address


def _is_unicast_ipv4(address: str) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    return parsed.version == 4 and not (
        parsed.is_loopback or parsed.is_multicast or parsed.is_unspecified
    )


def _deployments(names: str) -> tuple[str, ...]:
    try:
        return tuple(d.name for d in deployments(names.split(","), "--deployments"))
    except ValidationError as exc:
        raise ConfigError(str(exc)) from exc


def _down(args: argparse.Namespace) -> int:
    from podwire.stack.runner import stack_down

    if not stack_down(args.data_dir):
        print(f"no stack running on {args.data_dir}", file=sys.stderr)
    return 0
