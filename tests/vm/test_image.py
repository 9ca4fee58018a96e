"""The image scripts/setup built: what is in it, that it is reproducible, and the CLI."""

from __future__ import annotations

import stat
import subprocess
import sys

from podwire.vm import cpio, image, kernel, pvh
from tests.unit.test_vm_image import read_cpio


def test_initrd_holds_busybox_the_nic_modules_and_podwires_init(vm_image: image.Image) -> None:
    record = vm_image.manifest.kernel
    assert record.wanted == kernel.NIC_MODULES
    assert {"virtio_pci", "virtio_net", "net_failover", "failover"} <= set(record.modules)
    assert record.modules.index("failover") < record.modules.index("net_failover")
    assert record.modules.index("net_failover") < record.modules.index("virtio_net")
    entries = {
        name: (mode, data, rdev)
        for name, mode, data, rdev, _ in read_cpio(vm_image.initrd.read_bytes())
    }
    assert entries["init"][1] == b"bin/busybox"
    assert entries["dev/console"][0] == stat.S_IFCHR | 0o600 and entries["dev/console"][2] == (5, 1)
    assert entries["etc/podwire-vm/modules"][1].decode().split() == list(record.modules)
    for module in record.modules:
        assert entries[f"lib/modules/{module}.ko"][1].startswith(b"\x7fELF")
    for applet in ("sh", "ip", "udhcpc", "udhcpd", "ping", "base64", "timeout", "stty"):
        assert entries[f"bin/{applet}"][1] == b"busybox"
    assert stat.S_IMODE(entries["etc/podwire-vm/agent"][0]) == 0o755


def test_image_is_reproducible_and_its_kernel_boots_as_pvh(vm_image: image.Image) -> None:
    cache = vm_image.directory / "kernel"
    rebuilt = cpio.archive(image.initramfs_entries(cache, vm_image.manifest.kernel))
    assert rebuilt == vm_image.initrd.read_bytes()
    if vm_image.pvh:
        assert pvh.has_pvh_entry(vm_image.kernel.read_bytes())


def test_build_command_recognises_an_up_to_date_image(vm_image: image.Image) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "podwire.cli.main",
            "vm",
            "build",
            "--output",
            str(vm_image.directory),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    kernel_record = vm_image.manifest.kernel
    assert result.stdout.startswith(f"up to date: {vm_image.directory}")
    assert f"{kernel_record.package} {kernel_record.version}" in result.stdout
