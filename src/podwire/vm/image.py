"""``podwire vm build``: the VM image, built offline from Debian packages, and finding it.

The image directory holds ``kernel/`` (the kernel and NIC modules cut from Debian's kernel
package, ``podwire.vm.kernel``), ``initrd.cpio`` (busybox from ``busybox-static``, the
modules, podwire's init and hooks from ``guest/``) and ``image.json``. The initramfs is
uncompressed (3 MB: unpacking costs the guest nothing, gzip would cost TCG ~0.2 s) and
byte-for-byte reproducible. A build whose inputs are unchanged returns at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import ValidationError, VmError
from podwire.files import atomic_write
from podwire.schema.vmimage import ImageManifest, KernelRecord, parse_manifest
from podwire.vm import cpio, debian, kernel

# The builder's own code is an input too: a change to the image's layout rebuilds it.
BUILDER = (Path(__file__), Path(cpio.__file__))
BUSYBOX = Path("/bin/busybox")
BUSYBOX_PACKAGE = "busybox-static"  # the static build: the initramfs has no libc
GUEST = Path(__file__).with_name("guest")
# guest/ file -> (path in the image, executable)
GUEST_FILES = {
    "inittab": ("etc/inittab", False),
    "rcS": ("etc/podwire-vm/rcS", True),
    "udhcpc": ("etc/podwire-vm/udhcpc", True),
    "agent": ("etc/podwire-vm/agent", True),
}
MANIFEST = "image.json"
INITRD = "initrd.cpio"


@dataclass(frozen=True)
class Image:
    directory: Path
    manifest: ImageManifest

    @property
    def kernel(self) -> Path:
        return kernel.boot_image(self.directory / "kernel", self.manifest.kernel)

    @property
    def pvh(self) -> bool:
        return self.manifest.kernel.pvh

    @property
    def initrd(self) -> Path:
        return self.directory / INITRD


def default_dir() -> Path:
    """Beside the interpreter's environment (``.venv/share/podwire-vm``): git ignores it."""
    return Path(sys.prefix) / "share" / "podwire-vm"


def find(directory: Path | None = None) -> Image | None:
    """The built image in ``directory`` (default: the venv's), or None if there is none."""
    directory = directory or default_dir()
    try:
        manifest = parse_manifest((directory / MANIFEST).read_bytes(), str(directory / MANIFEST))
    except (OSError, ValidationError):
        return None
    image = Image(directory, manifest)
    return image if image.kernel.is_file() and image.initrd.is_file() else None


def load(directory: Path | None = None) -> Image:
    image = find(directory)
    if image is None:
        where = directory or default_dir()
        raise VmError(f"no VM image in {where}: run `podwire vm build --output {where}`")
    return image


def build(directory: Path, refresh_kernel: bool = False) -> tuple[Image, bool]:
    """The image in ``directory``, built if missing or stale; True if it was (re)built.

    The kernel is fetched once and kept: a later build reuses it unless ``refresh_kernel``
    asks for the package ``linux-image-amd64`` names now.
    """
    busybox_version = debian.installed_version(BUSYBOX_PACKAGE)
    if busybox_version is None or not BUSYBOX.is_file():
        raise VmError(f"{BUSYBOX_PACKAGE} is not installed (scripts/setup installs it)")
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory):
        cache = directory / "kernel"
        record = kernel.fetch(cache) if refresh_kernel else kernel.ensure(cache)
        inputs = _inputs_digest(cache, record)
        current = find(directory)
        if current is not None and current.manifest.inputs == inputs:
            return current, False
        entries = initramfs_entries(cache, record)
        atomic_write(directory / INITRD, cpio.archive(entries), 0o644)
        manifest = ImageManifest(record, busybox_version, inputs)
        atomic_write(directory / MANIFEST, manifest.encode(), 0o644)
        return Image(directory, manifest), True


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One builder at a time per directory (two set-ups, or a test and a set-up)."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _inputs_digest(cache: Path, record: KernelRecord) -> str:
    """Over the image's inputs: the kernel files by identity (the cache is only ever replaced
    as a whole; hashing 75 MB would cost every up-to-date check ~0.3 s), the rest by content."""
    digest = hashlib.sha256(record.encode())
    for path in kernel.files(cache, record):
        info = path.stat()
        digest.update(f"{path.name} {info.st_size} {info.st_mtime_ns}\n".encode())
    for path in (*BUILDER, BUSYBOX, *(GUEST / name for name in sorted(GUEST_FILES))):
        digest.update(f"{path.name} {path.stat().st_size}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def initramfs_entries(cache: Path, record: KernelRecord) -> list[cpio.CpioEntry]:
    entries = [
        cpio.file("bin/busybox", BUSYBOX.read_bytes(), executable=True),
        *(cpio.symlink(f"bin/{applet}", "busybox") for applet in _applets()),
        cpio.symlink("init", "bin/busybox"),  # busybox runs as init, by its name
        cpio.symlink("sbin", "bin"),
        cpio.symlink("usr/bin", "../bin"),
        cpio.symlink("usr/sbin", "../bin"),
        cpio.char_device("dev/console", 5, 1),  # init's stdio before devtmpfs is mounted
        *(cpio.directory(name) for name in ("proc", "sys", "run", "tmp", "root")),
        cpio.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"),
        cpio.file("etc/group", b"root:x:0:\n"),
        cpio.file("etc/podwire-vm/modules", "".join(f"{m}\n" for m in record.modules).encode()),
        *(
            cpio.file(f"lib/modules/{name}.ko", kernel.module_path(cache, name).read_bytes())
            for name in record.modules
        ),
    ]
    for name, (path, executable) in sorted(GUEST_FILES.items()):
        entries.append(cpio.file(path, (GUEST / name).read_bytes(), executable))
    return cpio.with_parents(entries)


def _applets() -> list[str]:
    listed = debian.run([str(BUSYBOX), "--list"]).split()
    return sorted(name for name in listed if name != "busybox" and "/" not in name)
