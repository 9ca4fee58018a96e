"""libnftables (Debian ``libnftables1``) through ctypes, on one thread in the host namespace.

A libnftables context is not thread-safe and its netlink socket belongs to the namespace it
was opened in, so one worker thread enters the host namespace once, opens the context there
and runs every buffer; the event loop only awaits it. Nor is the library itself across
contexts: listing a table fills its cache with every table of the namespace, and rules other
tools made (iptables-nft's xt matches, kubelet's and Neutron's agents') go through
libxtables' process-wide state. Several agents in one process (the tests, the benches) ran
two contexts at once and libnftables aborted the process, so every call into the library
holds one lock per process (``_LIBRARY_LOCK``; one agent per process never waits on it).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from podwire.errors import PermanentError, RetryableError
from podwire.log import get_logger
from podwire.netfilter.elements import ElementChange, Unencodable
from podwire.netfilter.nfnl import NfnlSocket
from podwire.netlink import netns_path, open_netns, setns

log = get_logger(__name__)

LIBRARY = "libnftables.so.1"
_OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON
_OUTPUT_HANDLE = 1 << 3  # NFT_CTX_OUTPUT_HANDLE
_LIBRARY_LOCK = threading.Lock()  # the C library's state is process-wide (module docstring)


class NftError(PermanentError):
    """The kernel or libnftables refused a buffer; the message is nft's own, with positions."""


class NftUnavailable(PermanentError):
    """libnftables is not installed (Debian ``libnftables1``)."""


def _load() -> Any:
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as exc:
        raise NftUnavailable(f"{LIBRARY}: {exc} (install Debian libnftables1)") from exc
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
        getattr(lib, name).restype = ctypes.c_int
    for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
        getattr(lib, name).restype = ctypes.c_char_p
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    return lib


class _Context:
    """One libnftables context; used only from the worker thread that created it."""

    def __init__(self, lib: Any, json_output: bool) -> None:
        self._lib = lib
        with _LIBRARY_LOCK:
            self._ctx = lib.nft_ctx_new(0)
            if not self._ctx:
                raise NftError("nft_ctx_new failed")
            lib.nft_ctx_buffer_output(self._ctx)
            lib.nft_ctx_buffer_error(self._ctx)
            if json_output:
                lib.nft_ctx_output_set_flags(self._ctx, _OUTPUT_JSON)

    def run(self, text: str) -> str:
        with _LIBRARY_LOCK:
            code = self._lib.nft_run_cmd_from_buffer(self._ctx, text.encode())
            out = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode()
            err = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode()
        if code != 0:
            raise NftError(err.strip() or f"nft returned {code}")
        return out

    def close(self) -> None:
        if self._ctx:
            with _LIBRARY_LOCK:
                self._lib.nft_ctx_free(self._ctx)
            self._ctx = None


class Nftables:
    """Run nft buffers in the namespace named ``netns`` (empty: ours): ``apply`` for changes,
    ``apply_elements`` for changes of set elements only, ``query`` for JSON listings
    (counters, the tables podwire owns)."""

    def __init__(self, netns: str = "", on_fallback: Callable[[str], None] | None = None) -> None:
        """``netns``: a name (``ip netns``) or a namespace file's path (a pod's, as CNI gives
        it). ``on_fallback``: told why, each time element changes went as text (a set the
        packer does not know: every pod's ADD would then pay libnftables' parse, unseen)."""
        self._lib = _load()
        self._netns = netns
        self._on_fallback = on_fallback
        self._entered = False
        self._contexts: dict[bool, _Context] = {}
        self._nfnl: NfnlSocket | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="pw-nft")

    def _enter(self) -> None:
        if self._netns and not self._entered:
            path = self._netns if self._netns.startswith("/") else netns_path(self._netns)
            fd = open_netns(path)
            try:
                setns(fd)  # this worker thread stays in the host namespace for good
            finally:
                os.close(fd)
        self._entered = True

    def _context(self, json_output: bool) -> _Context:
        self._enter()
        ctx = self._contexts.get(json_output)
        if ctx is None:
            ctx = self._contexts[json_output] = _Context(self._lib, json_output)
        return ctx

    def _run(self, text: str, json_output: bool) -> str:
        return self._context(json_output).run(text)

    async def apply(self, text: str) -> None:
        """One atomic transaction: every command in ``text`` takes effect, or none does."""
        await self._call(text, False)

    async def apply_elements(self, changes: Sequence[ElementChange]) -> None:
        """One atomic transaction of set element changes, packed here and sent on the
        caller's thread: packing a pod's few elements takes microseconds, where the worker
        hop and libnftables' parse and cache dump cost about a millisecond on a cold CPU
        here. The kernel answers within the send (waiting at most for another writer's
        commit). Sets the packer does not know go through libnftables, as text."""
        try:
            sock = self._nfnl or await self._open_nfnl()
            sock.apply(changes)
        except Unencodable as exc:
            log.debug("netfilter.elements_as_text", reason=str(exc))
            if self._on_fallback is not None:
                self._on_fallback(str(exc))
            await self.apply("\n".join(change.text() for change in changes) + "\n")
        except OSError as exc:
            raise NftError(f"nftables set elements: {exc}") from exc

    async def _open_nfnl(self) -> NfnlSocket:
        def opened() -> NfnlSocket:
            self._enter()  # the socket stays in the namespace the worker thread is in
            return NfnlSocket()

        loop = asyncio.get_running_loop()
        self._nfnl = await loop.run_in_executor(self._executor, opened)
        return self._nfnl

    async def query(self, text: str) -> str:
        return await self._call(text, True)

    async def _call(self, text: str, json_output: bool) -> str:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._run, text, json_output)
        except OSError as exc:  # entering the namespace
            raise RetryableError(f"netfilter in {self._netns or 'this namespace'}: {exc}") from exc

    def close(self) -> None:
        def free() -> None:
            for ctx in self._contexts.values():
                ctx.close()
            if self._nfnl is not None:
                self._nfnl.close()

        self._executor.submit(free).result()
        self._executor.shutdown()
