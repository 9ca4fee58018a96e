"""The mounts of a local Kubernetes node, in the machine's mount namespace.

kubelet runs in a mount namespace of its own (for its device-plugin directory, see
``kubelet``); the volumes it mounts for pods must still reach containerd, which runs in the
machine's namespace. A bind mount of the node's directory onto itself, made shared, is the
bridge: mounts kubelet makes below it propagate back. What kubelet and containerd mounted is
left behind when they stop, so the node unmounts everything below its directory itself.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from podwire.errors import KubeError

MOUNTINFO = Path("/proc/self/mountinfo")


def _decode(field: str) -> str:
    r"""mountinfo escapes space, tab, newline and backslash as ``\NNN`` (octal)."""
    for code in ("040", "011", "012", "134"):
        field = field.replace(f"\\{code}", chr(int(code, 8)))
    return field


def mount_points() -> list[str]:
    """Every mount point of this process's namespace, in mount order (parents first)."""
    lines = MOUNTINFO.read_text().splitlines()
    return [_decode(line.split()[4]) for line in lines]


def under(directory: Path, include_self: bool = False) -> list[str]:
    """Mount points below ``directory`` (and at it, with ``include_self``), parents first."""
    top = str(directory)
    found = [m for m in mount_points() if m.startswith(top + "/")]
    if include_self:
        found = [m for m in mount_points() if m == top] + found
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def share(directory: Path) -> None:
    """``directory`` becomes a shared mount of its own (bound onto itself once)."""
    if str(directory) not in under(directory, include_self=True):
        done = _run("mount", "--bind", str(directory), str(directory))
        if done.returncode != 0:
            raise KubeError(f"mount --bind {directory}: {done.stderr.strip()}")
    done = _run("mount", "--make-shared", str(directory))
    if done.returncode != 0:
        raise KubeError(f"mount --make-shared {directory}: {done.stderr.strip()}")


def unmount_under(directory: Path, include_self: bool = False) -> list[str]:
    """Unmount what is mounted below ``directory`` (children first); returns what stayed.

    A busy mount is detached lazily (``umount -l``): the processes that held it are gone
    by then, or are a leftover this cleanup is about to end anyway.
    """
    for point in reversed(under(directory, include_self)):
        if _run("umount", point).returncode != 0:
            _run("umount", "-l", point)
    return under(directory, include_self)
