"""Plain values shared by the device plugin modules (no I/O, no gRPC)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from podwire.deviceplugin.api import MAX_DEVICE_ID_LEN
from podwire.schema import fields

SOCKET_FILE = "memif.sock"
ENV_SOCKET = "MEMIF_SOCKET"
ENV_SECRET = "MEMIF_SECRET"
# 20 hex characters, like the reference plugin's random dir names; also the only names podwire
# will ever delete under memif_host_dir.
ALLOCATION_ID_RE = re.compile(r"[0-9a-f]{20}")
# VPP's memif protocol carries the secret in a 24-byte field.
SECRET_LEN = 24


@dataclass(frozen=True, order=True)
class PodName:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def valid_pod_name(value: str) -> bool:
    return bool(fields.K8S_NAME.fullmatch(value))


@dataclass(frozen=True)
class Allocation:
    """One container request's grant: its devices share one host dir, socket and secret."""

    id: str
    devices: tuple[str, ...]
    secret: str
    created_at: float
    pod: PodName | None = None


@dataclass(frozen=True)
class MemifInfo:
    """What the agent needs to serve a pod's memif: the host socket path and the secret."""

    devices: tuple[str, ...]
    host_dir: str
    host_socket: str
    container_socket: str
    secret: str


class DeviceNames:
    """Maps device indexes to kubelet device IDs (``<short name>-<index>``) and back."""

    def __init__(self, resource_name: str) -> None:
        short = resource_name.rpartition("/")[2]
        short = re.sub(r"[^A-Za-z0-9._-]", "-", short)[:40] or "dev"
        self.prefix = f"{short}-"
        self._re = re.compile(rf"{re.escape(self.prefix)}(0|[1-9][0-9]{{0,8}})")

    def device_id(self, index: int) -> str:
        value = f"{self.prefix}{index}"
        assert len(value) <= MAX_DEVICE_ID_LEN
        return value

    def index(self, device_id: str) -> int | None:
        match = self._re.fullmatch(device_id)
        return int(match.group(1)) if match else None


def host_dir(base: str, allocation_id: str) -> Path:
    return Path(base) / allocation_id
