"""The allocation checkpoint: one root-only JSON file, replaced atomically, group-committed
(``files.StateFile``, as the agent's own checkpoints).

Kubelet forgets nothing across a plugin restart, so neither may we: an Allocate answer is only
sent after the grant is durable here. Concurrent Allocate calls share one fsync (whoever holds
the write lock writes the newest staged state; callers whose state it covered just return),
which keeps p99 low under a burst of pod starts.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podwire.deviceplugin.model import (
    ALLOCATION_ID_RE,
    SECRET_LEN,
    Allocation,
    PodName,
    valid_pod_name,
)
from podwire.errors import PermanentError, RetryableError, ValidationError
from podwire.files import StateFile
from podwire.log import get_logger
from podwire.schema.doc import SCHEMA_VERSION, NewerVersion

log = get_logger(__name__)

_MAX_BYTES = 64 * 1024 * 1024


class CheckpointCorrupt(PermanentError):
    """The file exists but cannot be trusted (truncated, not JSON, wrong shape)."""


class CheckpointIncompatible(PermanentError):
    """The file is well-formed but belongs to another podwire version or configuration."""


class CheckpointWriteError(RetryableError):
    """The new state could not be made durable; the caller must roll back."""


@dataclass(frozen=True)
class CheckpointData:
    resource_name: str
    memif_host_dir: str
    allocations: tuple[Allocation, ...]


class CheckpointStore:
    def __init__(self, path: str | Path) -> None:
        self.file = StateFile(Path(path), f"checkpoint {path}", _MAX_BYTES)
        self.path = self.file.path

    @property
    def writes(self) -> int:
        return self.file.writes

    def load(self) -> CheckpointData | None:
        """Read the file; ``None`` when there is none yet (first start)."""
        try:
            body = self.file.read()
        except NewerVersion as exc:
            raise CheckpointIncompatible(str(exc)) from exc
        except ValidationError as exc:
            raise CheckpointCorrupt(str(exc)) from exc
        except OSError as exc:
            raise CheckpointCorrupt(f"checkpoint {self.path}: cannot read: {exc}") from exc
        return None if body is None else parse(body, str(self.path))

    def quarantine(self) -> Path:
        """Move an untrusted file aside (kept for the operator) so a fresh one can be written."""
        target = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        os.replace(self.path, target)
        return target

    def stage(self, data: CheckpointData) -> int:
        return self.file.stage(lambda: dump(data))

    async def flush(self, gen: int) -> None:
        """Return once a state at least as new as generation ``gen`` is on disk."""
        try:
            await self.file.flush(gen)
        except OSError as exc:
            raise CheckpointWriteError(
                f"checkpoint {self.path}: cannot write: {exc.strerror or exc}"
            ) from exc

    async def save(self, data: CheckpointData) -> None:
        await self.flush(self.stage(data))


def dump(data: CheckpointData) -> dict[str, Any]:
    return {
        "v": SCHEMA_VERSION,
        "resource_name": data.resource_name,
        "memif_host_dir": data.memif_host_dir,
        "allocations": [
            {
                "id": a.id,
                "devices": list(a.devices),
                "secret": a.secret,
                "created_at": a.created_at,
                "pod": None
                if a.pod is None
                else {"namespace": a.pod.namespace, "name": a.pod.name},
            }
            for a in data.allocations
        ],
    }


def parse(doc: dict[str, Any], where: str) -> CheckpointData:
    """Validate every field: the file drives directory deletion, so nothing is taken on trust
    (the file itself, its JSON and its version, ``StateFile.read`` checked)."""
    resource_name = _field(doc, "resource_name", str, where)
    memif_host_dir = _field(doc, "memif_host_dir", str, where)
    items = _field(doc, "allocations", list, where)
    allocations: list[Allocation] = []
    seen_ids: set[str] = set()
    seen_devices: set[str] = set()
    for position, item in enumerate(items):
        label = f"{where}: allocations[{position}]"
        allocation = _parse_allocation(item, label)
        if allocation.id in seen_ids:
            raise CheckpointCorrupt(f"checkpoint {label}: duplicate id {allocation.id}")
        clash = seen_devices.intersection(allocation.devices)
        if clash:
            raise CheckpointCorrupt(
                f"checkpoint {label}: device {sorted(clash)[0]} is granted twice"
            )
        seen_ids.add(allocation.id)
        seen_devices.update(allocation.devices)
        allocations.append(allocation)
    return CheckpointData(resource_name, memif_host_dir, tuple(allocations))


def _parse_allocation(item: Any, label: str) -> Allocation:
    if not isinstance(item, dict):
        raise CheckpointCorrupt(f"checkpoint {label}: must be an object")
    allocation_id = _field(item, "id", str, label)
    if not ALLOCATION_ID_RE.fullmatch(allocation_id):
        raise CheckpointCorrupt(f"checkpoint {label}: id {allocation_id!r} is not 20 hex digits")
    devices = _field(item, "devices", list, label)
    if not devices or not all(isinstance(d, str) and 0 < len(d) <= 63 for d in devices):
        raise CheckpointCorrupt(f"checkpoint {label}: devices must be a non-empty list of ids")
    if len(set(devices)) != len(devices):
        raise CheckpointCorrupt(f"checkpoint {label}: devices repeat")
    secret = _field(item, "secret", str, label)
    if len(secret) != SECRET_LEN:
        raise CheckpointCorrupt(f"checkpoint {label}: secret must be {SECRET_LEN} characters")
    created_at = item.get("created_at")
    if (
        not isinstance(created_at, int | float)
        or isinstance(created_at, bool)
        or not math.isfinite(created_at)
    ):
        raise CheckpointCorrupt(f"checkpoint {label}: created_at must be a number")
    return Allocation(
        allocation_id, tuple(devices), secret, float(created_at), _parse_pod(item, label)
    )


def _parse_pod(item: dict[str, Any], label: str) -> PodName | None:
    pod = item.get("pod")
    if pod is None:
        return None
    if not isinstance(pod, dict):
        raise CheckpointCorrupt(f"checkpoint {label}: pod must be an object or null")
    namespace = _field(pod, "namespace", str, label)
    name = _field(pod, "name", str, label)
    if not (valid_pod_name(namespace) and valid_pod_name(name)):
        raise CheckpointCorrupt(f"checkpoint {label}: pod {namespace}/{name} is not a valid name")
    return PodName(namespace, name)


def _field(doc: dict[str, Any], key: str, kind: type, label: str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind):
        raise CheckpointCorrupt(f"checkpoint {label}: {key!r} must be a {kind.__name__}")
    return value
