"""Worker threads that do netlink work inside a chosen network namespace.

Opening ``IPRoute(netns=...)`` forks a helper and costs ~10 ms; a thread that ``setns()``es
into the namespace and opens a plain ``IPRoute()`` costs ~1.9 ms (pyroute2 0.9.7, measured
here). ``setns`` only
moves the calling thread, so it must never run on the event loop's thread: these workers
own that. ``HostNetlink`` keeps threads parked in the host namespace with an open socket each;
``PodNetlink`` enters a pod's namespace for one call and returns to where it came from.

The CNI hot path uses ``HostNetlink.run_rtnl``: the job gets the thread's lean socket
(``rtnl.Rtnl``) and can open another one inside a pod's namespace; a netlink socket stays in
the namespace it was opened in, so the thread is home again before the job touches the pod.

Deleting a veth returns only after the kernel has waited out an RCU grace period (~16 ms
here, with no CPU used), and those waits overlap only between callers that are in the kernel
at the same time: 30 deletions one after another take ~500 ms, from 30 threads ~25 ms. So
``run_teardown`` has a pool of its own, wide enough for a burst of DELs, which also keeps
them from queueing ADDs and the binder behind them.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from podwire.errors import ConfigError
from podwire.netlink.errors import NotANamespace, translate
from podwire.netlink.rtnl import Rtnl

T = TypeVar("T")

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


def _own_netns() -> int:
    return os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)


def _go_home(home: int) -> None:
    # A thread that cannot go home would run later calls in a pod's namespace.
    try:
        setns(home)
    except OSError:
        os._exit(70)


class RtnlContext:
    """What a ``run_rtnl`` job works with: the host socket, and pod sockets on demand."""

    def __init__(self, host: Rtnl, home: int) -> None:
        self.host = host
        self._home = home

    def in_netns(self, netns_fd: int) -> Rtnl:
        """A socket inside the namespace ``netns_fd`` refers to; the caller closes it."""
        setns(netns_fd)
        try:
            return Rtnl()
        finally:
            _go_home(self._home)

    def close(self) -> None:
        self.host.close()
        os.close(self._home)


def _call(fn: Callable[..., T], ipr: Any, args: tuple[Any, ...]) -> T:
    try:
        return fn(ipr, *args)
    except (NetlinkError, OSError) as exc:
        raise translate(exc, getattr(fn, "__name__", "call")) from exc


class HostNetlink:
    """Threads in the host namespace (``host_netns``, or ours when empty), one IPRoute each."""

    def __init__(self, host_netns: str = "", threads: int = 4, teardown_threads: int = 32) -> None:
        self.host_netns = host_netns
        self._local = threading.local()
        self._sockets: list[Any] = []
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="pw-host-netlink")
        # Threads start on demand: an idle agent has none of these.
        self._teardown = ThreadPoolExecutor(teardown_threads, thread_name_prefix="pw-teardown")

    def _ipr(self) -> Any:
        ipr = getattr(self._local, "ipr", None)
        if ipr is None:
            self._enter_host()
            ipr = IPRoute()
            self._local.ipr = ipr
            with self._lock:
                self._sockets.append(ipr)
        return ipr

    def _rtnl(self) -> RtnlContext:
        context = getattr(self._local, "rtnl", None)
        if context is None:
            self._enter_host()
            context = RtnlContext(Rtnl(), _own_netns())
            self._local.rtnl = context
            with self._lock:
                self._sockets.append(context)
        return context

    def _enter_host(self) -> None:
        if self.host_netns and not getattr(self._local, "entered", False):
            fd = open_netns(netns_path(self.host_netns))
            try:
                setns(fd)
            finally:
                os.close(fd)
        self._local.entered = True

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...], lean: bool) -> T:
        try:
            handle = self._rtnl() if lean else self._ipr()
        except NotANamespace as exc:
            raise ConfigError(f"agent.host_netns: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"agent.host_netns: cannot enter {self.host_netns}: {exc}") from exc
        return _call(fn, handle, args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(ipr, *args)`` with a pyroute2 ``IPRoute`` in the host namespace."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, fn, args, False)

    async def run_rtnl(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(context, *args)`` with an ``RtnlContext`` (the lean hot-path sockets)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, fn, args, True)

    async def run_teardown(self, fn: Callable[..., T], *args: Any) -> T:
        """``run_rtnl`` for deletions: the kernel's waits of concurrent ones overlap."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._teardown, self._run, fn, args, True)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._teardown.shutdown(wait=True)
        with self._lock:
            for handle in self._sockets:
                handle.close()
            self._sockets.clear()


class PodNetlink:
    """Runs one function inside a pod's namespace per call, then returns the thread home."""

    def __init__(self, threads: int = 8) -> None:
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="pw-pod-netlink")

    def _home(self) -> int:
        fd = getattr(self._local, "home", None)
        if fd is None:
            fd = _own_netns()
            self._local.home = fd
        return int(fd)

    def _run(self, path: str, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        home = self._home()
        target = open_netns(path)
        try:
            setns(target)
        finally:
            os.close(target)
        try:
            ipr = IPRoute()
            try:
                return _call(fn, ipr, args)
            finally:
                ipr.close()
        finally:
            _go_home(home)

    async def run(self, path: str, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, path, fn, args)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
