"""Network namespaces: their files, and moving the calling thread between them.

``setns`` only moves the calling thread, so only threads kept for it call it: the netlink
workers (``nsexec``, and the ``Netlink`` handles they own, which open a namespace's sockets
there and go home), and nftables' one worker per namespace (``netfilter/nft.py``), which
enters its namespace for good.
"""

from __future__ import annotations

import ctypes
import os
import threading

from podwire.errors import ConfigError
from podwire.netlink.errors import NotANamespace

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
_libc = ctypes.CDLL(None, use_errno=True)


def netns_path(name: str) -> str:
    """Where ``ip netns`` keeps a named namespace."""
    if not name or "/" in name or name in (".", ".."):
        raise ConfigError(f"network namespace name {name!r} is not valid")
    return f"{NETNS_DIR}/{name}"


def is_netns(path: str) -> bool:
    """True if ``path`` is a network namespace file (nsfs inode, like /proc/self/ns/net).

    Every nsfs inode lives on the same pseudo superblock, so comparing the device number with
    our own namespace file tells a namespace apart from any ordinary file or directory.
    """
    try:
        target = os.stat(path)
        own = os.stat("/proc/self/ns/net")
    except OSError:
        return False
    return target.st_dev == own.st_dev and target.st_ino != 0


def same_netns(path: str, other: str) -> bool:
    """Whether two namespace files name one namespace (the same nsfs inode)."""
    try:
        first, second = os.stat(path), os.stat(other)
    except OSError:
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def host_netns_files(host_netns: str) -> tuple[str, ...]:
    """The namespaces no pod may be plugged into: the agent's own, the host's that
    ``agent.host_netns`` names, and init's (where readable: not in every container)."""
    named = (netns_path(host_netns),) if host_netns else ()
    return (*named, "/proc/self/ns/net", "/proc/1/ns/net")


def setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def open_netns(path: str) -> int:
    """Open a namespace file for ``setns`` or ``net_ns_fd``; NotANamespace if it is not one."""
    if not is_netns(path):
        raise NotANamespace(f"{path} does not exist or is not a network namespace")
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NotANamespace(f"cannot open network namespace {path}: {exc.strerror}") from exc


def own_netns() -> int:
    """A descriptor of the calling thread's namespace (to come back to after ``setns``)."""
    return os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)


def go_home(home: int) -> None:
    # A thread that cannot go home would run later calls in a pod's namespace.
    try:
        setns(home)
    except OSError:
        os._exit(70)
