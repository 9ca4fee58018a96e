"""What the agent records about each memif it serves, so a restarted agent serves them again.

One entry per pod attachment that got a memif: its own VIF (port), the grant's socket and
secret, the tap, and the master process (pid and start time, so a pid reused by another
process is never mistaken for ours). The file is root-only, like the device plugin's
checkpoint that holds the same secrets; it is always the old or the new state (atomic write).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from podwire.agent.checkpoint import StateFile
from podwire.cni.result import Address
from podwire.errors import ValidationError
from podwire.log import get_logger
from podwire.schema import doc, fields
from podwire.schema.vif import Vif

log = get_logger(__name__)

FILE_NAME = "memif-attachments.json"
MEMIF_IFNAME = "memif0"
MAX_FILE = 64 << 20


@dataclass(frozen=True)
class MemifEntry:
    attachment: str  # the pod's attachment whose ADD made this memif (<container>:<ifname>)
    vif_attachment: str  # the memif port's own attachment at the VIF source
    pod: dict[str, str]
    vif: Vif
    host_dir: str
    socket: str  # host path of the control socket
    container_socket: str
    secret: str
    tap: str
    bridge: str
    mtu: int
    addresses: tuple[Address, ...]
    pid: int = 0
    started: int = 0  # the master's start time (clock ticks since boot, /proc/PID/stat)

    def with_process(self, pid: int, started: int) -> MemifEntry:
        return replace(self, pid=pid, started=started)

    def to_json(self) -> dict[str, Any]:
        return {
            "vif_attachment": self.vif_attachment,
            "pod": self.pod,
            "vif": self.vif.to_json(),
            "host_dir": self.host_dir,
            "socket": self.socket,
            "container_socket": self.container_socket,
            "secret": self.secret,
            "tap": self.tap,
            "bridge": self.bridge,
            "mtu": self.mtu,
            "addresses": [{"address": a.address, "gateway": a.gateway} for a in self.addresses],
            "pid": self.pid,
            "started": self.started,
        }

    @classmethod
    def from_json(cls, attachment: str, raw: Any) -> MemifEntry:
        what = f"memif entry {attachment}"
        obj = doc.Obj(doc.as_object(raw, what), what)
        return cls(
            attachment=fields.attachment(attachment, what),
            vif_attachment=obj.req("vif_attachment", fields.attachment),
            pod={k: fields.k8s_name(v, f"{what}: pod") for k, v in _pod(obj).items()},
            vif=Vif.from_json(obj.req("vif", doc.as_object)),
            host_dir=obj.req("host_dir", _abs_path),
            socket=obj.req("socket", _abs_path),
            container_socket=obj.req("container_socket", _abs_path),
            secret=obj.req("secret", lambda v, w: fields.text(v, w, 24, empty=False)),
            tap=obj.req("tap", fields.ifname),
            bridge=obj.req("bridge", fields.ifname),
            mtu=obj.req("mtu", fields.mtu),
            addresses=tuple(
                _address(a, what) for a in obj.req("addresses", lambda v, w: fields.items(v, w, 8))
            ),
            pid=obj.opt("pid", lambda v, w: fields.integer(v, w, 0, 1 << 22), 0),
            started=obj.opt("started", lambda v, w: fields.integer(v, w, 0, 1 << 62), 0),
        )


def _pod(obj: doc.Obj) -> dict[str, Any]:
    pod = obj.req("pod", doc.as_object)
    return {key: pod[key] for key in ("namespace", "name") if key in pod}


def _abs_path(value: Any, what: str) -> str:
    text = fields.text(value, what, 4096, empty=False)
    if not text.startswith("/"):
        raise fields.fail(what, "must be an absolute path")
    return text


def _interface(value: Any, what: str) -> str:
    text = fields.text(value, what, 64, empty=False)
    try:
        if "/" not in text:
            raise ValueError(text)
        return str(ipaddress.ip_interface(text))
    except ValueError as exc:
        raise fields.fail(what, f"{value!r} is not an address with a prefix length") from exc


def _address(raw: Any, what: str) -> Address:
    obj = doc.Obj(doc.as_object(raw, what), what)
    address = obj.req("address", _interface)
    gateway = obj.maybe("gateway", lambda v, w: str(fields.ip_address(v, w)))
    return Address(address, gateway)


class MemifCheckpoint:
    def __init__(self, state_dir: str) -> None:
        path = Path(state_dir) / FILE_NAME
        self.file = StateFile(path, "memif checkpoint", "memifs", MAX_FILE)
        self.path = path
        self.entries: dict[str, MemifEntry] = {}

    def load(self) -> None:
        for key, raw in self.file.read().items():
            try:
                self.entries[key] = MemifEntry.from_json(key, raw)
            except (ValidationError, KeyError, TypeError) as exc:
                log.error("agent.memif.bad_checkpoint_entry", entry=key, error=str(exc))

    async def put(self, entry: MemifEntry) -> None:
        self.entries[entry.attachment] = entry
        await self.file.persist(self._items)

    async def remove(self, attachment: str) -> None:
        if self.entries.pop(attachment, None) is not None:
            await self.file.persist(self._items)

    def _items(self) -> dict[str, Any]:
        return {key: entry.to_json() for key, entry in self.entries.items()}
