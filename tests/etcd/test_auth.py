"""The etcd client against a real etcd with authentication on (a private one per test)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from podwire import keys
from podwire.errors import ConfigError, EtcdUnavailable, PermanentError
from podwire.etcd import admin
from podwire.etcd.client import EtcdClient
from podwire.etcd.errors import EtcdPermissionDenied
from podwire.etcd.roles import Grant, RoleSpec, node_role, server_role
from podwire.etcd.watch import PrefixWatcher, WatchBatch
from podwire.schema.deployment import Deployment
from podwire.stack.netutil import free_port
from tests.etcd.authetcd import AuthEtcd, started
from tests.etcd.test_client import make_tls_files


@pytest.fixture
async def authed(tmp_path: Path) -> AsyncIterator[AuthEtcd]:
    async with started(tmp_path) as etcd:
        yield etcd


Logins = Callable[[str], int]


@pytest.fixture
def logins(caplog: pytest.LogCaptureFixture) -> Logins:
    """How often a user has authenticated so far, as the client reports it to an operator
    (``etcd.authenticated``)."""
    caplog.set_level(logging.INFO, logger="podwire.etcd.client")

    def count(user: str) -> int:
        return sum(
            1
            for r in caplog.records
            if r.getMessage() == "etcd.authenticated" and r.fields["user"] == user  # type: ignore[attr-defined]
        )

    return count


async def test_wrong_password_is_a_config_error_naming_the_user(authed: AuthEtcd) -> None:
    await authed.user("node-a-user", node_role("node-a"), "right")
    with pytest.raises(ConfigError, match=r"etcd refused user 'node-a-user': wrong user name"):
        await EtcdClient.connect(authed.settings("node-a-user", "wrong"))


async def test_no_credentials_says_auth_is_required(authed: AuthEtcd) -> None:
    async with await EtcdClient.connect(authed.settings()) as anonymous:
        with pytest.raises(ConfigError, match=r"requires authentication; set etcd\.user"):
            await anonymous.put("/podwire/kick", b"")


async def test_node_role_allows_exactly_its_own_keys(authed: AuthEtcd) -> None:
    node_a = await authed.user("podwire-node-a", node_role("a"))
    node_b = await authed.user("podwire-node-b", node_role("b"))
    async with (
        await EtcdClient.connect(node_a) as a,
        await EtcdClient.connect(node_b) as b,
        await EtcdClient.connect(authed.root) as root,
    ):
        await root.put(keys.node_port("a", "p1"), b"{}")
        await root.put(keys.node_port("b", "p2"), b"{}")
        await root.put(keys.global_prefix() + "secgroups/sg1", b"{}")
        await b.put(keys.state_vtep("b"), b"{}")
        await a.put(keys.state_vtep("a"), b"{}")
        assert await a.get(keys.node_port("a", "p1")) is not None
        assert await a.get(keys.state_vtep("b")) is not None  # peers
        assert await a.get(keys.global_prefix() + "secgroups/sg1") is not None
        peers, _ = await a.get_prefix(keys.state_prefix() + "nodes/")
        assert {kv.key for kv in peers} == {keys.state_vtep("a"), keys.state_vtep("b")}
        other = keys.state_alive("b")
        with pytest.raises(EtcdPermissionDenied, match=rf"put {other}: permission denied for"):
            await a.put(other, b"{}")
        # Every node's desired ports: Neutron's bindings, which back peers' claims.
        assert await a.get(keys.node_port("b", "p2")) is not None
        with pytest.raises(EtcdPermissionDenied, match="etcd user 'podwire-node-a'"):
            await a.put(keys.node_port("a", "p1"), b"{}")  # written by the forwarder alone
        with pytest.raises(EtcdPermissionDenied, match=r"txn on /podwire/state/nodes/b/vtep"):
            await a.create_if_absent(keys.state_vtep("b"), b"{}")
        for forbidden in (keys.KICK, keys.vif("a", "x"), keys.election("controller")):
            with pytest.raises(EtcdPermissionDenied):
                await a.put(forbidden, b"")
        assert (await b.get(keys.state_vtep("b"))) is not None


async def test_a_deployments_node_role_covers_its_namespace_only(authed: AuthEtcd) -> None:
    """A node of deployment "blue" reads and writes its keys in blue's namespace; the same
    keys of the default deployment, and the other deployment's server keys, are refused."""
    blue = Deployment("blue")
    spec = node_role("a", blue)
    assert spec.name == "podwire-node-a@blue"
    user = await authed.user(spec.name, spec)
    server = server_role("ml2", [Deployment(), blue])
    assert {g.key for g in server.grants} >= {keys.nodes_prefix(), NAMESPACE + keys.nodes_prefix()}
    async with (
        await EtcdClient.connect(user, namespace=blue.etcd_namespace) as node,
        await EtcdClient.connect(authed.root) as root,
    ):
        await root.put(NAMESPACE + keys.node_port("a", "p1"), b"{}")
        await root.put(keys.node_port("a", "p0"), b"{}")
        await node.put(keys.state_vtep("a"), b"{}")
        assert await root.get(NAMESPACE + keys.state_vtep("a")) is not None
        assert await node.get(keys.node_port("a", "p1")) is not None
        outside = node.within("")
        with pytest.raises(EtcdPermissionDenied):
            await outside.get(keys.node_port("a", "p0"))
        with pytest.raises(EtcdPermissionDenied):
            await outside.put(keys.state_vtep("a"), b"{}")


NAMESPACE = Deployment("blue").etcd_namespace


async def test_denied_watch_is_permanent_and_names_the_prefix(
    authed: AuthEtcd, logins: Logins
) -> None:
    node_a = await authed.user("podwire-node-a", node_role("a"))
    async with await EtcdClient.connect(node_a) as a:
        watcher = PrefixWatcher(a, keys.vifs_prefix(), retry_initial=0.01)  # the controller's
        with pytest.raises(EtcdPermissionDenied, match=r"list /podwire/vifs/"):
            await anext(watcher.batches())
        watcher.revision = 1  # resume: straight to the watch, which etcd cancels
        with pytest.raises(EtcdPermissionDenied, match=r"watch /podwire/vifs/"):
            await anext(watcher.batches())
        assert logins("podwire-node-a") == 2  # once at start, once to rule out a stale token


async def next_batch(batches: AsyncIterator[WatchBatch]) -> WatchBatch:
    return await asyncio.wait_for(anext(batches), 20)


async def test_reauthenticates_after_restart_for_calls_and_keepalive(
    authed: AuthEtcd, logins: Logins
) -> None:
    node = await authed.user("podwire-node-a", node_role("a"))
    # Two endpoints, one dead: the token is renewed on whichever one the channel is on.
    dead = f"http://127.0.0.1:{free_port()}"
    node = replace(node, endpoints=[dead, authed.endpoint])
    async with await EtcdClient.connect(node) as client:
        lease = await client.grant_lease(30)
        await client.put(keys.state_alive("a"), b"1", lease=lease.id)
        watcher = PrefixWatcher(client, keys.state_node_prefix("a"), retry_initial=0.05)
        batches = watcher.batches()
        assert [e.key for e in (await next_batch(batches)).events] == [keys.state_alive("a")]
        assert logins("podwire-node-a") == 1

        authed.restart()  # etcd forgets every token it issued
        await reachable(client)  # Status needs no token: the old one is still held
        # Many callers meet the stale token at once; one Authenticate serves them all.
        await asyncio.gather(
            *(client.put(keys.state_physnet("a", f"p{i}"), b"{}") for i in range(10)),
            client.put(keys.state_vtep("a"), b"{}"),
        )
        assert logins("podwire-node-a") == 2
        batch = await next_batch(batches)
        assert keys.state_vtep("a") in {e.key for e in batch.events}
        assert await client.refresh_lease(lease.id) > 0
        assert await client.get(keys.state_alive("a")) is not None


async def test_watch_meeting_a_forgotten_token_renews_it_and_resumes(
    authed: AuthEtcd, logins: Logins
) -> None:
    node = await authed.user("podwire-node-a", node_role("a"))
    async with (
        await EtcdClient.connect(node) as client,
        await EtcdClient.connect(authed.root) as root,
    ):
        watcher = PrefixWatcher(client, keys.state_node_prefix("a"), retry_initial=0.05)
        batches = watcher.batches()
        assert (await next_batch(batches)).events == []
        authed.restart()
        await reachable(client)
        await reachable(root)
        await root.put(keys.state_vtep("a"), b"{}")  # root renews its own token, not ours
        # The watcher is the first of this client to meet the forgotten token: etcd cancels
        # its new watch as "permission denied"; one renewal later the event arrives.
        batch = await next_batch(batches)
        assert [e.key for e in batch.events] == [keys.state_vtep("a")]
        assert logins("podwire-node-a") == 2


async def reachable(client: EtcdClient) -> None:
    """Right after a restart the channel may still be in reconnect backoff."""
    for _ in range(150):
        try:
            await client.status()
            return
        except EtcdUnavailable:
            await asyncio.sleep(0.2)
    raise AssertionError("etcd did not come back")


async def test_roles_converge_and_rotation_locks_out_the_old_password(authed: AuthEtcd) -> None:
    spec = server_role("controller")
    async with await EtcdClient.connect(authed.root) as root:
        extra = RoleSpec(spec.name, (*spec.grants, Grant("readwrite", "/elsewhere/")))
        await admin.ensure_user(root, "ctl", extra, "first")
        first = await admin.ensure_user(root, "ctl", spec, "ignored")
        assert first.password is None and not first.created  # kept, not rotated
        role = await root.auth_rpc("RoleGet", admin.rpc.AuthRoleGetRequest(role=spec.name), "get")
        assert {bytes(p.key) for p in role.perm} == {g.key.encode() for g in spec.grants}
        async with await EtcdClient.connect(authed.settings("ctl", "first")) as ctl:
            await ctl.put(keys.vif("n1", "att"), b"{}")
            with pytest.raises(EtcdPermissionDenied):
                await ctl.put("/elsewhere/x", b"")
            rotated = await admin.ensure_user(root, "ctl", spec, "second", rotate=True)
            assert rotated.password == "second"
            with pytest.raises(ConfigError, match="etcd refused user 'ctl'"):
                await ctl.put(keys.vif("n1", "att"), b"{}")  # token gone, old password refused
        async with await EtcdClient.connect(authed.settings("ctl", "second")) as ctl:
            await ctl.delete(keys.vif("n1", "att"))


async def test_auth_over_tls(tmp_path: Path, logins: Logins) -> None:
    ca, cert, key = make_tls_files(tmp_path)
    async with started(tmp_path, str(cert), str(key), str(ca)) as authed:
        node = await authed.user("podwire-node-t", node_role("t"))
        async with await EtcdClient.connect(node) as client:
            await client.put(keys.state_vtep("t"), b"{}")
            authed.restart()
            await reachable(client)
            await client.put(keys.state_vtep("t"), b"{}")
            assert logins("podwire-node-t") == 2
            with pytest.raises(PermanentError, match="permission denied"):
                await client.put(keys.state_vtep("u"), b"{}")
