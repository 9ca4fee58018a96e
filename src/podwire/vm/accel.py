"""Which QEMU accelerator a VM gets: KVM where it runs a stock guest, else TCG.

``/dev/kvm`` opening and ``KVM_CREATE_VM`` succeeding is not enough: on this project's CI
machines /dev/kvm is served by ``kvm_pvm`` (PVM, KVM without hardware virtualization), which
runs only PVM-aware guest kernels at speed; Debian's kernel under it had not printed its banner
after 24-38 s, where TCG reaches init in 2-4 s. So KVM is chosen only when a hardware KVM
module (``kvm_intel``, ``kvm_amd``) is loaded and a VM can be created.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import ConfigError

KVM_DEVICE = "/dev/kvm"
KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01
KVM_API_VERSION = 12
HARDWARE_MODULES = ("kvm_intel", "kvm_amd")
CHOICES = ("auto", "kvm", "tcg")


@dataclass(frozen=True)
class Accel:
    name: str  # "kvm" or "tcg": QEMU's -accel
    reason: str  # why, for the operator and the reports


def choose(requested: str = "auto", modules: Path = Path("/sys/module")) -> Accel:
    if requested not in CHOICES:
        raise ConfigError(f"accel {requested!r} is not one of {', '.join(CHOICES)}")
    if requested == "tcg":
        return Accel("tcg", "asked for")
    problem = kvm_problem(modules)
    if requested == "kvm":
        return Accel("kvm", f"asked for ({problem})" if problem else "asked for")
    return Accel("tcg", problem) if problem else Accel("kvm", "hardware KVM")


def kvm_problem(modules: Path = Path("/sys/module")) -> str | None:
    """None if KVM can run a stock guest at hardware speed here, else why not."""
    return _create_vm_problem() or hardware_problem(modules)


def hardware_problem(modules: Path) -> str | None:
    """None if a hardware KVM module is loaded (``modules`` is /sys/module), else why not."""
    if any((modules / name).is_dir() for name in HARDWARE_MODULES):
        return None
    if (modules / "kvm_pvm").is_dir():
        return "/dev/kvm is PVM (kvm_pvm), which runs only PVM guest kernels at speed"
    return "no hardware KVM module (kvm_intel, kvm_amd) is loaded"


def _create_vm_problem() -> str | None:
    try:
        fd = os.open(KVM_DEVICE, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open {KVM_DEVICE}: {exc.strerror}"
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
        if version != KVM_API_VERSION:
            return f"{KVM_DEVICE} speaks KVM API {version}, not {KVM_API_VERSION}"
        os.close(fcntl.ioctl(fd, KVM_CREATE_VM, 0))
    except OSError as exc:
        return f"KVM_CREATE_VM failed: {exc.strerror}"
    finally:
        os.close(fd)
    return None
