"""Users and roles in etcd's auth store, through the client's Auth RPCs (no etcdctl).

Everything here converges: running it again leaves the same users, roles and permissions, so
a re-run after a partial failure or an upgrade that changed a role is safe. A user's password
is set when the user is created and changed only when asked (``rotate``), because changing it
locks out whoever runs with the old one.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from aetcd import rpc

from podwire.etcd.client import EtcdClient
from podwire.etcd.roles import Grant, RoleSpec
from podwire.log import get_logger

log = get_logger(__name__)

ROOT_USER = "root"
ROOT_ROLE = "root"

_PERM_TYPES = {"read": rpc.Permission.READ, "readwrite": rpc.Permission.READWRITE}


@dataclass(frozen=True)
class Issued:
    """The outcome for one user; ``password`` is None when an existing one was kept."""

    user: str
    password: str | None
    created: bool


def new_password() -> str:
    return secrets.token_urlsafe(24)


def _range(client: EtcdClient, grant: Grant) -> tuple[bytes, bytes]:
    """The grant's range in the client's namespace (a deployment's roles cover its keys)."""
    return client.raw_range(grant.key) if grant.prefix else (client.raw_key(grant.key), b"")


async def auth_enabled(client: EtcdClient) -> bool:
    response = await client.auth_rpc("AuthStatus", rpc.AuthStatusRequest(), "auth status")
    return bool(response.enabled)


async def enable_auth(client: EtcdClient, root_password: str) -> None:
    """Create ``root`` (etcd requires it) and turn authentication on; on a client without
    credentials, while auth is still off."""
    if ROOT_USER not in await _users(client):
        request = rpc.AuthUserAddRequest(name=ROOT_USER, password=root_password)
        await client.auth_rpc("UserAdd", request, "add user root")
    grant = rpc.AuthUserGrantRoleRequest(user=ROOT_USER, role=ROOT_ROLE)
    await client.auth_rpc("UserGrantRole", grant, "grant role root to root")
    await client.auth_rpc("AuthEnable", rpc.AuthEnableRequest(), "enable auth")
    log.info("etcd.auth.enabled")


async def ensure_role(client: EtcdClient, spec: RoleSpec) -> None:
    """Make the role exist with exactly the spec's permissions (extra ones are revoked)."""
    roles = await client.auth_rpc("RoleList", rpc.AuthRoleListRequest(), "list roles")
    if spec.name not in roles.roles:
        await client.auth_rpc("RoleAdd", rpc.AuthRoleAddRequest(name=spec.name), "add role")
    current = await client.auth_rpc(
        "RoleGet", rpc.AuthRoleGetRequest(role=spec.name), f"get role {spec.name}"
    )
    have = {(p.permType, bytes(p.key), bytes(p.range_end)) for p in current.perm}
    want = {(_PERM_TYPES[g.access], *_range(client, g)) for g in spec.grants}
    for _type, key, end in have - want:
        request = rpc.AuthRoleRevokePermissionRequest(role=spec.name, key=key, range_end=end)
        await client.auth_rpc("RoleRevokePermission", request, f"revoke on role {spec.name}")
    for perm_type, key, end in want - have:
        perm = rpc.Permission(permType=perm_type, key=key, range_end=end)
        request = rpc.AuthRoleGrantPermissionRequest(name=spec.name, perm=perm)
        await client.auth_rpc("RoleGrantPermission", request, f"grant on role {spec.name}")


async def ensure_user(
    client: EtcdClient, user: str, spec: RoleSpec, password: str, rotate: bool = False
) -> Issued:
    """The user exists, has the role and nothing else; ``password`` is set if new or rotating."""
    await ensure_role(client, spec)
    created = user not in await _users(client)
    if created:
        request = rpc.AuthUserAddRequest(name=user, password=password)
        await client.auth_rpc("UserAdd", request, f"add user {user}")
    elif rotate:
        change = rpc.AuthUserChangePasswordRequest(name=user, password=password)
        await client.auth_rpc("UserChangePassword", change, f"change password of {user}")
    info = await client.auth_rpc("UserGet", rpc.AuthUserGetRequest(name=user), f"get user {user}")
    for role in set(info.roles) - {spec.name}:
        request = rpc.AuthUserRevokeRoleRequest(name=user, role=role)
        await client.auth_rpc("UserRevokeRole", request, f"revoke role {role} from {user}")
    if spec.name not in info.roles:
        grant = rpc.AuthUserGrantRoleRequest(user=user, role=spec.name)
        await client.auth_rpc("UserGrantRole", grant, f"grant role {spec.name} to {user}")
    log.info("etcd.auth.user", user=user, role=spec.name, created=created, rotated=rotate)
    return Issued(user, password if created or rotate else None, created)


async def _users(client: EtcdClient) -> set[str]:
    response = await client.auth_rpc("UserList", rpc.AuthUserListRequest(), "list users")
    return set(response.users)
