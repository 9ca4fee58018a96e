"""A private etcd with authentication on, for tests that must not touch the shared one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from podwire.config import EtcdSettings
from podwire.etcd import admin
from podwire.etcd.client import EtcdClient
from podwire.etcd.roles import RoleSpec
from podwire.stack.etcd_server import EtcdServer
from podwire.stack.netutil import free_port
from tests.etcd.conftest import PrivateEtcd

ROOT_PASSWORD = "root-test-password"


@dataclass
class AuthEtcd:
    etcd: PrivateEtcd
    ca_file: str = ""

    @property
    def endpoint(self) -> str:
        return self.etcd.server.client_url

    def settings(self, user: str = "", password: str = "", timeout: float = 3) -> EtcdSettings:
        return EtcdSettings(
            endpoints=[self.endpoint],
            ca_file=self.ca_file,
            user=user,
            password=password,
            timeout=timeout,
        )

    @property
    def root(self) -> EtcdSettings:
        return self.settings(admin.ROOT_USER, ROOT_PASSWORD)

    def restart(self) -> None:
        self.etcd.stop()
        self.etcd.start()

    async def user(self, name: str, spec: RoleSpec, password: str = "pw") -> EtcdSettings:
        async with await EtcdClient.connect(self.root) as client:
            await admin.ensure_user(client, name, spec, password)
        return self.settings(name, password)


@asynccontextmanager
async def started(
    tmp_path: Path, cert_file: str = "", key_file: str = "", ca_file: str = ""
) -> AsyncIterator[AuthEtcd]:
    """Start it, create root, turn auth on; stopped (data left to tmp_path) afterwards."""
    server = EtcdServer(
        tmp_path / "etcd", free_port(), free_port(), cert_file=cert_file, key_file=key_file
    )
    etcd = PrivateEtcd(server, tmp_path / "etcd.log")
    etcd.start()
    try:
        made = AuthEtcd(etcd, ca_file)
        async with await EtcdClient.connect(made.settings()) as client:
            await admin.enable_auth(client, ROOT_PASSWORD)
        yield made
    finally:
        etcd.stop()
