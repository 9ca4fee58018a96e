"""Worker threads that do netlink work inside a chosen network namespace.

Opening ``IPRoute(netns=...)`` forks a helper and costs ~10 ms; a thread that ``setns()``es
into the namespace and opens a plain ``IPRoute()`` costs ~1.9 ms (pyroute2 0.9.7, measured
here). ``setns`` only
moves the calling thread, so it must never run on the event loop's thread: these workers
own that. ``HostNetlink`` keeps threads parked in the host namespace with a ``Netlink``
handle each (its sockets opened there, on first use); ``PodNetlink`` enters a pod's namespace
for one call and returns to where it came from. A host job reaches a pod's namespace through
``Netlink.in_netns``, which opens that handle's sockets inside the pod and is home again
before the job uses them.

Deleting a veth returns only after the kernel has waited out an RCU grace period (~16 ms
here, with no CPU used), and those waits overlap only between callers that are in the kernel
at the same time: 30 deletions one after another take ~500 ms, from 30 threads ~25 ms. So
``run_teardown`` has a pool of its own, wide enough for a burst of DELs, which also keeps
them from queueing ADDs and the binder behind them.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pyroute2.netlink.exceptions import NetlinkError

from podwire.errors import ConfigError
from podwire.netlink.errors import NotANamespace, translate
from podwire.netlink.handle import Netlink
from podwire.netlink.netns import go_home, netns_path, open_netns, own_netns, setns

T = TypeVar("T")


def _call(fn: Callable[..., T], nl: Netlink, args: tuple[Any, ...]) -> T:
    try:
        return fn(nl, *args)
    except (NetlinkError, OSError) as exc:
        raise translate(exc, getattr(fn, "__name__", "call")) from exc


class HostNetlink:
    """Threads in the host namespace (``host_netns``, or ours when empty), a handle each."""

    def __init__(self, host_netns: str = "", threads: int = 4, teardown_threads: int = 32) -> None:
        self.host_netns = host_netns
        self._local = threading.local()
        self._handles: list[tuple[Netlink, int]] = []  # each worker's handle and home
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="pw-host-netlink")
        # Threads start on demand: an idle agent has none of these.
        self._teardown = ThreadPoolExecutor(teardown_threads, thread_name_prefix="pw-teardown")

    def _handle(self) -> Netlink:
        handle: Netlink | None = getattr(self._local, "handle", None)
        if handle is None:
            self._enter_host()
            home = own_netns()
            handle = Netlink(home=home)
            self._local.handle = handle
            with self._lock:
                self._handles.append((handle, home))
        return handle

    def _enter_host(self) -> None:
        if self.host_netns and not getattr(self._local, "entered", False):
            fd = open_netns(netns_path(self.host_netns))
            try:
                setns(fd)
            finally:
                os.close(fd)
        self._local.entered = True

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        try:
            handle = self._handle()
        except NotANamespace as exc:
            raise ConfigError(f"agent.host_netns: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"agent.host_netns: cannot enter {self.host_netns}: {exc}") from exc
        return _call(fn, handle, args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(netlink, *args)`` on a worker in the host namespace (``Netlink``)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, fn, args)

    async def run_teardown(self, fn: Callable[..., T], *args: Any) -> T:
        """``run`` for deletions: the kernel's waits of concurrent ones overlap."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._teardown, self._run, fn, args)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._teardown.shutdown(wait=True)
        with self._lock:
            for handle, home in self._handles:
                handle.close()
                os.close(home)
            self._handles.clear()


class PodNetlink:
    """Runs one function inside a pod's namespace per call, then returns the thread home."""

    def __init__(self, threads: int = 8) -> None:
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="pw-pod-netlink")

    def _home(self) -> int:
        fd = getattr(self._local, "home", None)
        if fd is None:
            fd = own_netns()
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
            handle = Netlink()  # opens its sockets while the thread is in the pod
            try:
                return _call(fn, handle, args)
            finally:
                handle.close()
        finally:
            go_home(home)

    async def run(self, path: str, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, path, fn, args)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
