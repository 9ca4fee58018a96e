"""The build machine's Debian tools, which fetch and unpack the packages the image is made of.

The kernel comes from Debian's ``linux-image-<release>`` package, fetched with ``apt-get
download`` and unpacked with ``dpkg-deb -x`` into the image's cache: installing it would run
its maintainer scripts (initramfs-tools, /boot, bootloader hooks) on a machine that only wants
a guest kernel, and would put a second kernel's modules into the host's /lib/modules.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from podwire.errors import VmError

KERNEL_META_PACKAGE = "linux-image-amd64"  # depends on the current linux-image-<release>


def run(argv: list[str], cwd: Path | None = None) -> str:
    """A tool's stdout; VmError naming the tool and its last line of complaint otherwise."""
    try:
        result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise VmError(f"cannot run {argv[0]}: {exc.strerror}") from exc
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        errors = [line for line in lines if line.startswith("E:")] or lines
        detail = errors[-1] if errors else f"exit {result.returncode}"
        raise VmError(f"{' '.join(argv[:2])} failed: {detail}")
    return result.stdout


def installed_version(package: str) -> str | None:
    try:
        out = run(["dpkg-query", "-W", "-f=${Status}\t${Version}", package])
    except VmError:
        return None
    status, _, version = out.partition("\t")
    return version if status == "install ok installed" else None


def kernel_package() -> str:
    """The versioned kernel package the ``linux-image-amd64`` meta package points at now."""
    out = run(["apt-cache", "depends", "--important", KERNEL_META_PACKAGE])
    for line in out.splitlines():
        kind, _, name = line.strip().partition(": ")
        if kind == "Depends" and name.startswith("linux-image-"):
            return name
    raise VmError(f"apt-cache knows no kernel package behind {KERNEL_META_PACKAGE}")


def download(package: str, into: Path) -> Path:
    """Fetch ``package``'s .deb into ``into``; refreshes the package lists once if the
    mirror no longer has the version they name."""
    try:
        run(["apt-get", "download", "-q", package], cwd=into)
    except VmError:
        run(["apt-get", "update", "-qq"])
        run(["apt-get", "download", "-q", package], cwd=into)
    debs = sorted(into.glob(f"{package}_*.deb"))
    if len(debs) != 1:
        raise VmError(f"apt-get download {package} left {len(debs)} .deb files in {into}")
    return debs[0]


def deb_field(deb: Path, name: str) -> str:
    return run(["dpkg-deb", "-f", str(deb), name]).strip()


def unpack(deb: Path, into: Path) -> None:
    run(["dpkg-deb", "-x", str(deb), str(into)])
