"""Single entry point for every benchmark: ``.venv/bin/python -m bench.run [--samples N]``.

Starts one local stack (``--stack-dir`` keeps its data for the next run), runs each section
against it and prints one Markdown table with medians, p99, sample counts and, where a
reference exists, its figure from the same run and the ratio ours/reference (lower is better).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.stats import render
from podwire.stack.client import start_background, stop_background

SECTIONS = [
    "etcd_bench",
    "neutron_bench",
    "ml2_bench",
    "policy_bench",
    "controller_bench",
    "pool_sync_bench",  # samples: ports deleted and ports re-addressed (10-100 each)
    "node_release_bench",  # samples capped at 5 nodes of 110 pods
    "heal_bench",  # before recovery_bench: its controller lists every port of the stack
    "recovery_bench",
    "cni_bench",
    "cri_bench",
    "active_bench",
    "sg_bench",
    "tap_bench",
    "l2pop_bench",
    "l3_bench",  # samples capped at 20 floating IP associations
    "stack_bench",
    "deviceplugin_bench",
    "memif_bench",
    "vm_bench",  # samples capped at 5 boots per variant
    "scale_bench",  # samples = pod create/delete cycles per mode (adaptive, fixed min=5)
    # samples = connections per target; control paths capped at 100 changes; gets --kubernetes
    "service_bench",
    "kube_bench",  # the stack gets --kubernetes; samples capped at 40 pods one at a time
    "netpol_bench",  # the stack gets --kubernetes; samples = pods, capped at 200
]
# The sections that need the stack's Kubernetes.
KUBERNETES = {"kube_bench", "netpol_bench", "service_bench"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.run", description=__doc__)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--only", nargs="*", choices=SECTIONS, default=SECTIONS)
    parser.add_argument(
        "--stack-dir",
        help="keep the stack's data here between runs (the recovery bench's ports are created"
        " once); default: a temporary directory",
    )
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pwb-", dir="/tmp") as tmp:
        Path(tmp).chmod(0o711)  # the stack's RabbitMQ runs as its own user and must reach it
        # With the RPC bus: the tap bench runs Neutron's DHCP agent.
        # Some sections go through the Kubernetes API: the stack runs its control plane too.
        kube = bool(KUBERNETES & set(args.only))
        proc, stack = start_background(
            Path(args.stack_dir or Path(tmp) / "stack"),
            timeout=300.0 if kube else 180.0,
            extra=("--rpc", "--kubernetes") if kube else ("--rpc",),
        )
        try:
            for name in args.only:
                print(f"running {name} ...", file=sys.stderr, flush=True)
                module = importlib.import_module(f"bench.{name}")
                rows.extend(module.run(stack, args.samples))
        finally:
            stop_background(proc)
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
