"""The guest kernel: Debian's current amd64 kernel package, cut down to what the VM needs.

Debian builds virtio-net as a module (``virtio_net``, which needs ``net_failover`` and
``failover``) and, in bookworm's 6.1, the virtio PCI transport too (``virtio_pci`` with
``virtio_pci_modern_dev``, ``virtio_pci_legacy_dev``, ``virtio``, ``virtio_ring``). The
package ships no ``modules.dep`` (its postinst runs depmod), so dependencies are read from each
module's own ``.modinfo`` ``depends=`` field; a wanted module that another kernel builds in
(``modules.builtin``) is simply not loaded. Only the kernel image and those modules are kept;
the 400 MB unpacked package is removed at once. The kernel's ELF is unpacked from the bzImage
for PVH boot (``podwire.vm.pvh``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from podwire.errors import ValidationError, VmError
from podwire.files import atomic_write
from podwire.schema.vmimage import KernelRecord, parse_kernel
from podwire.vm import debian, pvh

NIC_MODULES = ("virtio_pci", "virtio_net")  # transport and driver; the rest follows from them
RECORD = "kernel.json"
BZIMAGE = "vmlinuz"
ELF = "vmlinux"  # for PVH boot (podwire.vm.pvh), when the kernel supports it


def module_path(cache: Path, name: str) -> Path:
    return cache / "modules" / f"{name}.ko"


def boot_image(cache: Path, record: KernelRecord) -> Path:
    """What QEMU's ``-kernel`` gets: the PVH ELF where there is one, else the bzImage."""
    return cache / (ELF if record.pvh else BZIMAGE)


def files(cache: Path, record: KernelRecord) -> list[Path]:
    return [
        cache / BZIMAGE,
        *([cache / ELF] if record.pvh else []),
        *(module_path(cache, name) for name in record.modules),
    ]


def cached(cache: Path) -> KernelRecord | None:
    """The kernel already in ``cache``, if its record is valid and every file is there."""
    try:
        record = parse_kernel((cache / RECORD).read_bytes(), str(cache / RECORD))
    except (OSError, ValidationError):
        return None
    if record.wanted != NIC_MODULES:
        return None
    return record if all(path.is_file() for path in files(cache, record)) else None


def ensure(cache: Path) -> KernelRecord:
    return cached(cache) or fetch(cache)


def fetch(cache: Path) -> KernelRecord:
    """Download and unpack the current kernel package; ``cache`` is replaced as a whole."""
    package = debian.kernel_package()
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".kernel-", dir=cache.parent) as tmp:
        work = Path(tmp)
        deb = debian.download(package, work)
        version = debian.deb_field(deb, "Version")
        root = work / "root"
        debian.unpack(deb, root)
        deb.unlink()
        release = _release(root, package)
        staging = work / "kernel"
        record = _stage(root, release, staging, package, version)
        shutil.rmtree(root)
        if cache.exists():
            shutil.rmtree(cache)
        staging.rename(cache)
    return record


def _release(root: Path, package: str) -> str:
    releases = [path.name for path in (root / "lib" / "modules").iterdir() if path.is_dir()]
    if len(releases) != 1:
        raise VmError(f"{package} holds {len(releases)} module trees, expected one")
    return releases[0]


def _stage(root: Path, release: str, staging: Path, package: str, version: str) -> KernelRecord:
    tree = root / "lib" / "modules" / release
    vmlinuz = root / "boot" / f"vmlinuz-{release}"
    if not vmlinuz.is_file():
        raise VmError(f"{package} has no boot/vmlinuz-{release}")
    available = {_name(path): path for path in (tree / "kernel").rglob("*.ko")}
    order = load_order(NIC_MODULES, available, builtin_modules(tree))
    (staging / "modules").mkdir(parents=True)
    shutil.copyfile(vmlinuz, staging / BZIMAGE)
    pvh_ok = pvh.write_if_pvh(vmlinuz, staging / ELF)
    for name in order:
        shutil.copyfile(available[name], module_path(staging, name))
    record = KernelRecord(package, version, release, tuple(order), pvh_ok, NIC_MODULES)
    atomic_write(staging / RECORD, record.encode(), 0o644)
    return record


def _name(path: Path) -> str:
    return path.name.removesuffix(".ko").replace("-", "_")


def builtin_modules(tree: Path) -> set[str]:
    try:
        lines = (tree / "modules.builtin").read_text().split()
    except OSError:
        return set()
    return {_name(Path(line)) for line in lines}


def dependencies(module: Path) -> list[str]:
    """The ``depends=`` names in a module's ``.modinfo`` (NUL-separated key=value strings)."""
    for token in module.read_bytes().split(b"\0"):
        if token.startswith(b"depends="):
            listed = token.removeprefix(b"depends=").decode()
            return [name.replace("-", "_") for name in listed.split(",") if name]
    return []


def load_order(wanted: tuple[str, ...], available: dict[str, Path], builtin: set[str]) -> list[str]:
    """``wanted`` and everything they need, each after its dependencies; built-in ones left
    out."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order or name in builtin:
            return
        if name not in available:
            raise VmError(f"kernel module {name} is neither a module nor built in")
        if name in visiting:
            raise VmError(f"kernel module {name} depends on itself")
        visiting.add(name)
        for dependency in dependencies(available[name]):
            visit(dependency)
        order.append(name)

    for name in wanted:
        visit(name)
    return order
