"""The one atomic file write (a checkpoint, a secret or a config is always the old or the new),
and the one file of state built on it.

A temp file beside the target is written in full, fsync'd, renamed over the target, and the
directory is fsync'd too: without that last step a crash can leave the rename unwritten, and
the file is then the old one although the caller was told it was saved.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podwire.schema import doc


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # the umask must not widen or narrow what the caller asked for
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class StateFile:
    """A file of state podwire keeps across restarts (the agent's checkpoints, the device
    plugin's grants): one versioned JSON object, replaced atomically, group-committed.

    Changes made while a write is in flight share the next one, so a burst of ADDs or
    Allocate calls pays a few fsyncs, not one each. A caller ``stage``s how to build the new
    body (built on the caller's thread, where its state is changed, when the write starts) and
    ``flush``es until the file holds at least that stage; ``persist`` does both.
    """

    def __init__(self, path: Path, what: str, max_bytes: int) -> None:
        self.path = path
        self.what = what
        self._max = max_bytes
        self._lock = asyncio.Lock()
        self._body: Callable[[], dict[str, Any]] | None = None
        self._staged = 0  # bumped by every stage
        self._written = 0  # the stage the file on disk reflects
        self.writes = 0

    def read(self) -> dict[str, Any] | None:
        """The versioned body; None when there is no file yet. Raises ValidationError
        (``doc.NewerVersion`` for a newer podwire's file) or OSError."""
        try:
            with self.path.open("rb") as stream:
                raw = stream.read(self._max + 1)
        except FileNotFoundError:
            return None
        return doc.decode_document(raw, self.what, self._max)

    def write(self, body: dict[str, Any]) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        encoded = json.dumps({**body, "v": doc.SCHEMA_VERSION}, sort_keys=True).encode()
        atomic_write(self.path, encoded)

    def stage(self, body: Callable[[], dict[str, Any]]) -> int:
        self._body = body
        self._staged += 1
        return self._staged

    async def flush(self, stage: int) -> None:
        """Return once the file holds ``stage`` or a later one; OSError if it cannot."""
        async with self._lock:
            if self._written >= stage or self._body is None:
                return
            covered, body = self._staged, self._body()
            await asyncio.to_thread(self.write, body)
            self._written = covered
            self.writes += 1

    async def persist(self, body: Callable[[], dict[str, Any]]) -> None:
        await self.flush(self.stage(body))
