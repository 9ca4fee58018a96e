"""A reproducible initramfs: the kernel's ``newc`` cpio format, written entry by entry.

Every entry gets owner root, mtime 0 and an inode number from its position, and entries are
written in the order given, so the same inputs always give the same bytes (no ``cpio`` or
``find`` on the build machine, whose order and metadata would leak into the image).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import PurePosixPath

TRAILER = "TRAILER!!!"


@dataclass(frozen=True)
class CpioEntry:
    path: str  # inside the image, without a leading "/"
    mode: int  # file type and permission bits, as in st_mode
    data: bytes = b""  # a file's contents or a symlink's target
    rdev: tuple[int, int] = (0, 0)  # a device node's (major, minor)


def directory(path: str) -> CpioEntry:
    return CpioEntry(path, stat.S_IFDIR | 0o755)


def file(path: str, data: bytes, executable: bool = False) -> CpioEntry:
    return CpioEntry(path, stat.S_IFREG | (0o755 if executable else 0o644), data)


def symlink(path: str, target: str) -> CpioEntry:
    return CpioEntry(path, stat.S_IFLNK | 0o777, target.encode())


def char_device(path: str, major: int, minor: int, mode: int = 0o600) -> CpioEntry:
    return CpioEntry(path, stat.S_IFCHR | mode, rdev=(major, minor))


def with_parents(entries: list[CpioEntry]) -> list[CpioEntry]:
    """``entries`` with every directory they need created before them, each directory once."""
    emitted: set[str] = set()
    ordered: list[CpioEntry] = []
    for entry in entries:
        for parent in reversed(PurePosixPath(entry.path).parents):
            name = str(parent)
            if name != "." and name not in emitted:
                emitted.add(name)
                ordered.append(directory(name))
        if stat.S_ISDIR(entry.mode):
            if entry.path in emitted:
                continue
            emitted.add(entry.path)
        ordered.append(entry)
    return ordered


def archive(entries: list[CpioEntry]) -> bytes:
    out = bytearray()
    for inode, entry in enumerate(entries, start=1):
        _append(out, inode, entry)
    _append(out, 0, CpioEntry(TRAILER, 0))
    return bytes(out)


def _append(out: bytearray, inode: int, entry: CpioEntry) -> None:
    name = entry.path.encode() + b"\0"
    fields = (
        inode,
        entry.mode,
        0,  # uid
        0,  # gid
        2 if stat.S_ISDIR(entry.mode) else 1,  # nlink
        0,  # mtime
        len(entry.data),
        0,  # devmajor
        0,  # devminor
        entry.rdev[0],
        entry.rdev[1],
        len(name),
        0,  # check (unused by newc)
    )
    out += b"070701" + b"".join(b"%08x" % value for value in fields)
    out += name
    _pad(out)
    out += entry.data
    _pad(out)


def _pad(out: bytearray) -> None:
    out += b"\0" * (-len(out) % 4)
