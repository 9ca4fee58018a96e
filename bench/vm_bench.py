"""VM boot: QEMU's start to the guest's DHCP lease, on a tap on a bridge with a real dnsmasq.

Rows (in seconds): QEMU start -> guest init, -> lease, and the first DISCOVER ->
lease, each for the accelerator the launcher picks here (KVM only where it runs a stock guest:
podwire.vm.accel); the reference is the same VM booted from the bzImage instead of the PVH ELF
(what the build unpacks it for). Every boot is a new QEMU on the same tap and MAC, as a
restarted VM is. ``samples`` is capped at 5 boots per variant: each takes seconds.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.stats import row
from podwire.schema.ports import tap_name
from podwire.stack import procs
from podwire.vm import accel, image, launcher
from tests.agent.netenv import NetEnv
from tests.vm import lan as lans

MAX_BOOTS = 5


def run(stack: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    built = image.load()
    boots = max(1, min(samples, MAX_BOOTS))
    env = NetEnv()
    try:
        with tempfile.TemporaryDirectory(prefix="pwvb-", dir="/tmp") as tmp:
            return _measure(built, lans.build(env), Path(tmp), boots)
    finally:
        env.cleanup()


def _measure(built: image.Image, lan: lans.Lan, work: Path, boots: int) -> list[dict[str, Any]]:
    mac = "fa:16:3e:" + ":".join(uuid.uuid4().hex[i : i + 2] for i in (0, 2, 4))
    dnsmasq = lans.start_dnsmasq(lan, work, {mac: lans.VM_ADDRESS})
    spec = launcher.VmSpec("bench", tap_name(str(uuid.uuid4())), mac, work, lan.host)
    chosen = accel.choose()
    try:
        pvh = [_boot(spec, built, lan) for _ in range(boots)]
        bzimage = [_boot(spec, _as_bzimage(built), lan) for _ in range(boots)] if built.pvh else []
    finally:
        procs.stop_child(dnsmasq)
    print(f"vm_bench: accel {chosen.name} ({chosen.reason})", file=sys.stderr)
    label = f"VM boot ({chosen.name})"
    ref = "bzImage boot" if bzimage else ""

    def seconds(boots: list[launcher.BootTimes], what: str) -> list[float]:
        return [getattr(times, what) or 0.0 for times in boots]

    rows = [
        row(f"{label}: QEMU start -> {name}", seconds(pvh, what), ref, seconds(bzimage, what), "s")
        for name, what in (("init", "init"), ("DHCP lease", "lease"))
    ]
    return [
        *rows,
        row(f"{label}: first DISCOVER -> lease", seconds(pvh, "discover_to_lease"), unit="s"),
    ]


def _boot(spec: launcher.VmSpec, built: image.Image, lan: lans.Lan) -> launcher.BootTimes:
    vm = launcher.launch(spec, built)
    try:
        lan.plug(spec.tap)
        vm.wait_ready()
        vm.wait_lease(timeout=60)
        return vm.boot_times()
    finally:
        vm.kill()


def _as_bzimage(built: image.Image) -> image.Image:
    kernel = dataclasses.replace(built.manifest.kernel, pvh=False)
    return dataclasses.replace(built, manifest=dataclasses.replace(built.manifest, kernel=kernel))
