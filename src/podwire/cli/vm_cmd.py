"""``podwire vm build`` (the tiny VM image; the set-up script runs it) and ``podwire vm start``
(a VM on a tap in a host's namespace, its commands read from stdin): docs/vm.md."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from podwire.errors import ValidationError, VmError
from podwire.schema import fields
from podwire.schema.ports import tap_name
from podwire.vm import accel, image, launcher


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("vm", help="tiny QEMU VMs on podwire tap ports")
    verbs = parser.add_subparsers(dest="vm_command", required=True, metavar="VERB")
    make = verbs.add_parser("build", help="build the VM image (quick when up to date)")
    make.add_argument("--output", type=Path, default=None, help="image directory")
    make.add_argument(
        "--refresh-kernel",
        action="store_true",
        help="fetch the kernel linux-image-amd64 names now (default: keep the cached one)",
    )
    make.set_defaults(handler=run_build)
    _add_start(verbs)


def _add_start(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    start = verbs.add_parser(
        "start", help="start a VM; run each line of stdin in it; stop it at the end"
    )
    nic = start.add_mutually_exclusive_group(required=True)
    nic.add_argument("--port-id", help="the Neutron port: the tap is tap + its first 11 chars")
    nic.add_argument("--tap", help="the tap's name (for a device that is not a Neutron port)")
    start.add_argument("--mac", required=True, help="the NIC's MAC (the port's)")
    start.add_argument("--netns", default=None, help="the host's namespace (ip netns name)")
    start.add_argument("--run-dir", required=True, type=Path, help="sockets and logs (short)")
    start.add_argument("--name", default="podwire-vm", help="the VM's name")
    start.add_argument("--memory", type=int, default=128, help="MiB (default 128)")
    start.add_argument("--accel", default="auto", choices=accel.CHOICES)
    start.add_argument("--no-dhcp", action="store_true", help="no DHCP client at boot")
    start.add_argument("--image", type=Path, default=None, help="image directory")
    start.add_argument(
        "--wait", action="store_true", help="after stdin ends, keep running until SIGTERM"
    )
    start.set_defaults(handler=run_start)


def run_build(args: argparse.Namespace) -> int:
    built, fresh = image.build(args.output or image.default_dir(), args.refresh_kernel)
    kernel = built.manifest.kernel
    boot = "PVH" if kernel.pvh else "bzImage"
    what = "built" if fresh else "up to date"
    print(
        f"{what}: {built.directory} (kernel {kernel.package} {kernel.version}, {boot} boot;"
        f" modules {' '.join(kernel.modules)}; busybox {built.manifest.busybox_version})"
    )
    return 0


def run_start(args: argparse.Namespace) -> int:
    spec = launcher.VmSpec(
        name=args.name,
        tap=args.tap or tap_name(_port_id(args.port_id)),
        mac=args.mac,
        run_dir=args.run_dir,
        netns=args.netns,
        memory_mb=args.memory,
        accel=args.accel,
        dhcp=not args.no_dhcp,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    vm = launcher.start(spec, image.load(args.image))
    try:
        _report_boot(vm)
        _serve_stdin(vm)
        if args.wait:
            vm.wait_exit()
    finally:
        vm.stop()
    return 0


def _port_id(value: str) -> str:
    try:
        return fields.neutron_id(value, "--port-id")
    except ValidationError as exc:
        raise VmError(str(exc)) from exc


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _report_boot(vm: launcher.Vm) -> None:
    print(
        f"vm {vm.spec.name}: pid {vm.pid}, accel {vm.accel.name} ({vm.accel.reason}),"
        f" tap {vm.spec.tap} in {vm.spec.netns or 'this namespace'}, ready in"
        f" {vm.ready_at - vm.started_at:.2f} s",
        flush=True,
    )
    if not vm.spec.dhcp:
        return
    try:
        lease = vm.wait_lease(timeout=60.0)
    except VmError as exc:
        print(f"vm {vm.spec.name}: {exc}", file=sys.stderr, flush=True)
        return
    print(
        f"vm {vm.spec.name}: lease {lease.address} router {lease.router or '-'} mtu"
        f" {lease.mtu or '-'}; QEMU start -> lease {lease.bound_at - vm.started_at:.2f} s,"
        f" first DISCOVER -> lease {lease.discover_to_lease:.3f} s",
        flush=True,
    )


def _serve_stdin(vm: launcher.Vm) -> None:
    for line in sys.stdin:
        command = line.strip()
        if not command:
            continue
        rc, output = vm.run(command)
        sys.stdout.write(output)
        if rc != 0:
            print(f"[exit {rc}]")
        sys.stdout.flush()
