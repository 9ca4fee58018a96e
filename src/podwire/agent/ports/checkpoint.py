"""The agent's local record of what it plugged; it survives agent restarts.

One store for each of its files (``schema/checkpoints.py`` has their entries and readers): the
pod attachments and the memifs. Every change is written (``files.StateFile``: atomic,
group-committed) before the answer that depends on it. A damaged file stops the agent with a
message, since starting empty would forget live pods; a bad entry is logged and skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from podwire.errors import ConfigError, ValidationError
from podwire.files import StateFile
from podwire.log import get_logger
from podwire.schema import checkpoints, doc
from podwire.schema.checkpoints import Attachment, MemifEntry

log = get_logger(__name__)

ATTACHMENTS_FILE = "cni-attachments.json"
MEMIFS_FILE = "memif-attachments.json"


class _Recorded(Protocol):
    @property
    def attachment(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


E = TypeVar("E", bound=_Recorded)


class EntryStore(Generic[E]):
    """Entries by attachment id, in one section of one state file."""

    def __init__(
        self, path: Path, what: str, section: str, read: Callable[[str, Any], E], max_bytes: int
    ) -> None:
        self.file = StateFile(path, what, max_bytes)
        self.path = path
        self._section = section
        self._read = read
        self.entries: dict[str, E] = {}

    def load(self) -> int:
        """Read the file; returns how many entries were stored under another id than their
        canonical one (rewritten under it now)."""
        renamed = 0
        for key, raw in self._raw_entries().items():
            try:
                entry = self._read(key, raw)
            except ValidationError as exc:
                log.error("agent.checkpoint.bad_entry", file=str(self.path), error=str(exc))
                continue
            self.entries[entry.attachment] = entry
            renamed += entry.attachment != key
        if renamed:
            self.file.write(self._body())
            log.info("agent.checkpoint.migrated", file=str(self.path), entries=renamed)
        return renamed

    def _raw_entries(self) -> dict[str, Any]:
        try:
            body = self.file.read()
        except OSError as exc:
            raise ConfigError(f"agent.state_dir: cannot read {self.path}: {exc}") from exc
        except ValidationError as exc:
            raise ConfigError(f"{exc}; move {self.path} away to start empty") from exc
        if body is None:
            return {}
        try:
            return doc.as_object(body.get(self._section, {}), f"{self.file.what}: section")
        except ValidationError as exc:
            raise ConfigError(f"{exc}; move {self.path} away to start empty") from exc

    def get(self, attachment: str) -> E | None:
        return self.entries.get(attachment)

    async def put(self, entry: E) -> None:
        self.entries[entry.attachment] = entry
        await self.file.persist(self._body)

    async def remove(self, attachment: str) -> None:
        if self.entries.pop(attachment, None) is not None:
            await self.file.persist(self._body)

    def _body(self) -> dict[str, Any]:
        return {self._section: {key: entry.to_json() for key, entry in self.entries.items()}}


def attachments(state_dir: str) -> EntryStore[Attachment]:
    path = Path(state_dir) / ATTACHMENTS_FILE
    return EntryStore(
        path, f"checkpoint {path}", "attachments", checkpoints.attachment_entry, 256 << 20
    )


def memifs(state_dir: str) -> EntryStore[MemifEntry]:
    """Root-only, like the device plugin's checkpoint that holds the same secrets."""
    path = Path(state_dir) / MEMIFS_FILE
    return EntryStore(path, f"memif checkpoint {path}", "memifs", checkpoints.memif_entry, 64 << 20)
