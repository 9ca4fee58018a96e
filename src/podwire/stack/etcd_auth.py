"""etcd authentication for the local stack: the secrets it keeps, and turning auth on.

Passwords live in ``DIR/etcd-auth/<user>.json`` (directory 0700, files 0600), so only the
stack's owner can read them; ``podwire etcd grant-node --data-dir DIR`` finds the root user
there and keeps the users it creates there too, which is what lets a re-run print the same
password again instead of rotating it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from podwire.config import EtcdSettings
from podwire.errors import ConfigError, PermanentError, StackError
from podwire.etcd import admin
from podwire.etcd.client import EtcdClient
from podwire.etcd.roles import server_role
from podwire.files import atomic_write
from podwire.keys import check_segment
from podwire.schema.deployment import DEFAULT_NAME, Deployment

AUTH_DIR = "etcd-auth"
SERVER_USER = "podwire-stack-server"  # the stack's neutron-server (ml2)


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str


class SecretStore:
    """One JSON file per etcd user, readable by the owner only."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / AUTH_DIR

    def load(self, user: str) -> Credentials | None:
        path = self._file(user)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: unreadable etcd credentials: {exc}") from exc
        if not (isinstance(raw, dict) and isinstance(raw.get("password"), str)):
            raise ConfigError(f'{path}: expected {{"user": ..., "password": ...}}')
        return Credentials(user, raw["password"])

    def save(self, creds: Credentials) -> None:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)
        body = {"user": creds.user, "password": creds.password}
        atomic_write(self._file(creds.user), json.dumps(body).encode())

    def _file(self, user: str) -> Path:
        return self.path / f"{check_segment(user, 'etcd user')}.json"


def root_settings(endpoint: str, data_dir: Path) -> EtcdSettings:
    """Settings for the stack's etcd as its root user, from the data dir's secrets."""
    root = SecretStore(data_dir).load(admin.ROOT_USER)
    if root is None:
        raise ConfigError(
            f"{data_dir / AUTH_DIR}: no root credentials; was the stack started with --etcd-auth?"
        )
    return EtcdSettings(endpoints=[endpoint], user=root.user, password=root.password)


def prepare(
    endpoint: str, data_dir: Path, deployments: Sequence[str] = (DEFAULT_NAME,)
) -> Credentials:
    """Turn auth on (first start) and return the server user's credentials for ml2."""
    try:
        return asyncio.run(_prepare(endpoint, data_dir, deployments))
    except ConfigError as exc:
        raise StackError(f"etcd auth: {exc}") from exc


async def _prepare(endpoint: str, data_dir: Path, deployments: Sequence[str]) -> Credentials:
    store = SecretStore(data_dir)
    root = store.load(admin.ROOT_USER)
    if root is None:
        root = Credentials(admin.ROOT_USER, admin.new_password())
        store.save(root)
    async with await EtcdClient.connect(EtcdSettings(endpoints=[endpoint])) as anonymous:
        if not await _enabled_or_locked(anonymous):
            await admin.enable_auth(anonymous, root.password)
    async with await EtcdClient.connect(root_settings(endpoint, data_dir)) as client:
        server = store.load(SERVER_USER) or Credentials(SERVER_USER, admin.new_password())
        store.save(server)
        # The file is the truth: an existing user gets the password on file again.
        # The stack's neutron-server serves every deployment it lists, with one user.
        role = server_role("ml2", [Deployment(name) for name in deployments])
        await admin.ensure_user(client, SERVER_USER, role, server.password, rotate=True)
        return server


async def _enabled_or_locked(client: EtcdClient) -> bool:
    """True when auth is already on (an anonymous AuthStatus is then refused)."""
    try:
        return await admin.auth_enabled(client)
    except PermanentError:
        return True
