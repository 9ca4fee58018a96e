"""Entry point of ``scripts/demo``."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from podwire.demo.kube import missing as kube_missing
from podwire.demo.scenario import Scenario, step
from podwire.errors import PodwireError
from podwire.stack.client import start_background, stop_background


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__)
    parser.add_argument("--pods", type=int, default=20, choices=range(2, 41), metavar="2..40")
    parser.add_argument("--keep", action="store_true", help="leave it running until Ctrl-C")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pwdemo-", dir="/tmp"))
    work.chmod(0o711)  # the stack's RabbitMQ runs as its own user and must reach its dir
    started = time.perf_counter()
    # --rpc: Neutron's agents; --kubernetes: kube-apiserver, its controllers and scheduler.
    extra = ("--rpc",) if kube_missing() else ("--rpc", "--kubernetes")
    kube = "" if kube_missing() else " + kube-apiserver"
    step(f"starting etcd + MariaDB + RabbitMQ + Neutron (podwire ml2 driver){kube} in {work}")
    proc, stack = start_background(work / "stack", extra=extra)
    try:
        code = _run(stack, work, args.keep, args.pods)
    finally:
        stop_background(proc)  # whatever failed, nothing of the stack keeps running
    if code == 0:
        shutil.rmtree(work, ignore_errors=True)
        step(f"done in {time.perf_counter() - started:.0f} s; nothing left behind")
    return code


def _run(stack: dict[str, object], work: Path, keep: bool, pods: int) -> int:
    """The scenario, its report, and its teardown whatever happened before it."""
    code = 0
    scenario = Scenario(stack, work, pods)
    try:
        figures = scenario.run()
        step("report")
        for line in figures.lines():
            print(f"    {line}")
        if keep:
            _wait_for_interrupt(stack, work)
    except PodwireError as exc:
        print(f"demo failed: {exc} (logs in {work})", file=sys.stderr)
        code = 1
    finally:
        step("tearing down")
        left = scenario.teardown()
        if left:
            print(f"left behind: {', '.join(left)}", file=sys.stderr)
            code = 1
    return code


def _wait_for_interrupt(stack: dict[str, object], work: Path) -> None:
    step(f"running: neutron {stack['neutron']}, etcd {stack['etcd']}, configs in {work}")
    step("try: podwire status; press Ctrl-C to tear down")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
