"""``podwire kube-node``: a Kubernetes node (containerd + kubelet) for a simulated host."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from podwire.config import LogSettings
from podwire.log import setup_logging


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "kube-node",
        help="run containerd and kubelet as Kubernetes Node HOST of a stack up --kubernetes,"
        " until SIGTERM/SIGINT",
    )
    parser.add_argument(
        "--data-dir", required=True, type=Path, help="a stack up --kubernetes data dir"
    )
    parser.add_argument("--host", required=True, help="the simulated host: the Node's name")
    parser.add_argument(
        "--netns", required=True, help="the host's network namespace (kubelet and containerd)"
    )
    parser.add_argument("--agent-socket", required=True, help="the host's podwire agent CNI socket")
    parser.add_argument("--network", required=True, help="the pods' Neutron network id or name")
    parser.add_argument("--project", default="", help="the pods' Neutron project id")
    parser.add_argument(
        "--security-group",
        action="append",
        default=[],
        dest="security_groups",
        help="a Neutron security group of the pods' ports (repeatable; default: the project's)",
    )
    parser.add_argument(
        "--node-ip",
        default="",
        help="kubelet's --node-ip (default: the namespace's first global IPv4 address)",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the Node to be Ready",
    )
    parser.add_argument("--log-level", default="WARNING")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from podwire.kube.node import KubeNode, NodeOptions

    setup_logging(LogSettings(level=args.log_level.upper()))
    options = NodeOptions(
        data_dir=args.data_dir,
        host=args.host,
        netns=args.netns,
        agent_socket=args.agent_socket,
        network=args.network,
        project=args.project,
        security_groups=tuple(args.security_groups),
        node_ip=args.node_ip,
        ready_timeout=args.ready_timeout,
    )

    def announce(info: dict[str, Any]) -> None:
        print(json.dumps(info))
        sys.stdout.flush()

    return KubeNode(options).run(announce)
