"""The agent's local record of pod attachments; it survives agent restarts.

DEL must work after a restart (and with the pod's namespace gone), and a repeated ADD must
return the same result, so every attachment is written here before ADD answers. Writes go to a
temp file renamed over the old one: the file is always the old or the new state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podwire.cni.result import Attached
from podwire.errors import ConfigError, ValidationError
from podwire.files import atomic_write
from podwire.log import get_logger
from podwire.schema import doc, fields
from podwire.schema.vif import Vif

log = get_logger(__name__)

FILE_NAME = "cni-attachments.json"
MAX_FILE = 256 << 20


@dataclass(frozen=True)
class Attachment:
    attachment: str
    container_id: str
    ifname: str
    network_name: str
    netns: str
    pod: dict[str, str] | None
    vif: Vif
    attached: Attached

    def to_json(self) -> dict[str, Any]:
        return {
            "container_id": self.container_id,
            "ifname": self.ifname,
            "network_name": self.network_name,
            "netns": self.netns,
            "pod": self.pod,
            "vif": self.vif.to_json(),
            "attached": self.attached.to_json(),
        }

    @classmethod
    def from_json(cls, attachment: str, raw: Any) -> Attachment:
        if not isinstance(raw, dict):
            raise ValidationError(f"checkpoint entry {attachment}: expected an object")
        try:
            return cls(
                attachment=attachment,
                container_id=fields.container_id(raw["container_id"], f"{attachment}: container"),
                ifname=fields.ifname(raw["ifname"], f"{attachment}: ifname"),
                network_name=str(raw["network_name"]),
                netns=str(raw["netns"]),
                pod=raw.get("pod"),
                vif=Vif.from_json(raw["vif"]),
                attached=Attached.from_json(raw["attached"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError(f"checkpoint entry {attachment}: {exc}") from exc


def _canonical(entry: Attachment) -> Attachment:
    canonical = fields.attachment_id(entry.container_id, entry.ifname)
    return (
        entry if entry.attachment == canonical else dataclasses.replace(entry, attachment=canonical)
    )


class StateFile:
    """One of the agent's checkpoint files: a versioned object whose ``section`` maps ids to
    entries. A damaged file stops the agent with a message (the operator decides: starting
    empty would forget live pods); writes are atomic and group-committed, so changes made while
    a write is in flight share the next one and a burst of ADDs pays a few fsyncs, not one each.
    """

    def __init__(self, path: Path, what: str, section: str, max_bytes: int) -> None:
        self.path = path
        self._what, self._section, self._max = what, section, max_bytes
        self._lock = asyncio.Lock()
        self._changes = 0  # bumped by every change
        self._written = 0  # the change count the file on disk reflects

    def read(self) -> dict[str, Any]:
        """The raw entries by id; empty when there is no file yet."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"agent.state_dir: cannot read {self.path}: {exc}") from exc
        try:
            body = doc.decode_versioned(text, self._what, self._max)
            return doc.as_object(body.get(self._section, {}), f"{self._what}: {self._section}")
        except ValidationError as exc:
            raise ConfigError(
                f"{self._what} {self.path} is damaged ({exc}); move it away to start empty"
            ) from exc

    def write(self, items: dict[str, Any]) -> None:
        body = {"v": doc.SCHEMA_VERSION, self._section: items}
        atomic_write(self.path, json.dumps(body, sort_keys=True).encode())

    async def persist(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """Return once the file holds the caller's change (``snapshot`` gives every entry)."""
        self._changes += 1
        mine = self._changes
        async with self._lock:
            if self._written >= mine:
                return
            covered, items = self._changes, snapshot()
            await asyncio.to_thread(self.write, items)
            self._written = covered


class Checkpoint:
    def __init__(self, state_dir: str) -> None:
        self.file = StateFile(Path(state_dir) / FILE_NAME, "checkpoint", "attachments", MAX_FILE)
        self.path = self.file.path
        self.entries: dict[str, Attachment] = {}

    def load(self) -> None:
        migrated = 0
        for key, raw in self.file.read().items():
            try:
                entry = _canonical(Attachment.from_json(key, raw))
            except ValidationError as exc:
                log.error("agent.checkpoint.bad_entry", entry=key, error=str(exc))
                continue
            self.entries[entry.attachment] = entry
            migrated += entry.attachment != key
        if migrated:
            # Entries from before ``<container>:<ifname>`` ids: stored under the new ids now.
            self.file.write(self._items())
            log.info("agent.checkpoint.migrated", entries=migrated)

    def ports(self) -> dict[str, str]:
        """attachment -> the port id its VIF holds."""
        return {key: entry.vif.port_id for key, entry in self.entries.items()}

    def get(self, attachment: str) -> Attachment | None:
        return self.entries.get(attachment)

    async def put(self, entry: Attachment) -> None:
        self.entries[entry.attachment] = entry
        await self.file.persist(self._items)

    async def remove(self, attachment: str) -> None:
        if self.entries.pop(attachment, None) is not None:
            await self.file.persist(self._items)

    def _items(self) -> dict[str, Any]:
        return {key: entry.to_json() for key, entry in self.entries.items()}
