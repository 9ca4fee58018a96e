"""A small asyncio client for etcd v3, on the wire types that ``aetcd`` ships.

aetcd's own client dials one endpoint without TLS; podwire needs several endpoints, TLS and
control over streams (watch resume, lease keepalive), so it drives the gRPC stubs directly and
keeps every etcd call in this module. All keys and values cross this boundary as ``str`` keys
and ``bytes`` values; every gRPC failure leaves as an ``EtcdUnavailable`` (retryable) or a
``PermanentError``.

With ``etcd.user`` set, every call carries a token from the Authenticate RPC. etcd forgets
tokens when a member restarts and when they expire, and then answers "invalid auth token" (for
unary calls) or cancels a new watch as "permission denied": the client then authenticates
again, once for all callers that held the stale token, and repeats the call once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
from aetcd import rpc

from podwire.config import EtcdSettings
from podwire.errors import ConfigError, EtcdUnavailable, PermanentError
from podwire.etcd.errors import authentication_error, token_rejected, translate
from podwire.log import get_logger

log = get_logger(__name__)

PAGE_SIZE = 1000

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]
What = str | Callable[[], str]  # names the call in errors; a callable when costly to build


def _name(what: What) -> str:
    return what if isinstance(what, str) else what()


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True)
class Compare:
    """One txn guard; build with the helpers below, never by hand."""

    message: Any


@dataclass(frozen=True)
class Op:
    """One txn operation; build with ``put_op`` / ``delete_op``."""

    message: Any


def prefix_end(prefix: str) -> bytes:
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"


def key_exists(key: str) -> Compare:
    return Compare(
        rpc.Compare(
            key=key.encode(),
            result=rpc.Compare.GREATER,
            target=rpc.Compare.CREATE,
            create_revision=0,
        )
    )


def key_absent(key: str) -> Compare:
    return Compare(
        rpc.Compare(
            key=key.encode(), result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, create_revision=0
        )
    )


def mod_revision_is(key: str, revision: int) -> Compare:
    return Compare(
        rpc.Compare(
            key=key.encode(),
            result=rpc.Compare.EQUAL,
            target=rpc.Compare.MOD,
            mod_revision=revision,
        )
    )


def lease_is(key: str, lease_id: int) -> Compare:
    return Compare(
        rpc.Compare(
            key=key.encode(), result=rpc.Compare.EQUAL, target=rpc.Compare.LEASE, lease=lease_id
        )
    )


def put_op(key: str, value: bytes, lease: int = 0) -> Op:
    return Op(rpc.RequestOp(request_put=rpc.PutRequest(key=key.encode(), value=value, lease=lease)))


def delete_op(key: str) -> Op:
    return Op(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key.encode())))


def _to_kv(kv: Any) -> KeyValue:
    return KeyValue(
        key=kv.key.decode(),
        value=bytes(kv.value),
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease=kv.lease,
    )


def _channel_target(endpoints: Sequence[str]) -> tuple[str, bool]:
    """One gRPC target for all endpoints, so the channel fails over between them."""
    hosts = []
    schemes = set()
    for endpoint in endpoints:
        parts = urlsplit(endpoint)
        if not parts.hostname or not parts.port:
            raise ConfigError(f"etcd.endpoints: {endpoint!r} needs a host and a port")
        schemes.add(parts.scheme)
        hosts.append(f"{parts.hostname}:{parts.port}")
    if len(schemes) > 1:
        raise ConfigError("etcd.endpoints: mix of http and https endpoints")
    if len(hosts) == 1:
        return hosts[0], schemes == {"https"}
    if not all(_is_ipv4(host.rsplit(":", 1)[0]) for host in hosts):
        raise ConfigError("etcd.endpoints: several endpoints must be given as IPv4 addresses")
    return "ipv4:" + ",".join(hosts), schemes == {"https"}


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def _read_file(path: str, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"etcd.{key}: cannot read {path}: {exc.strerror}") from exc


class EtcdClient:
    """An open connection to an etcd cluster. Create with ``await EtcdClient.connect(...)``."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        timeout: float,
        login: tuple[str, str] | None = None,
    ) -> None:
        self._channel = channel
        self._timeout = timeout
        self._login = login
        self._metadata: Metadata = ()
        self._auth_lock = asyncio.Lock()
        self.authentications = 0
        self._kv = rpc.KVStub(channel)
        self._lease = rpc.LeaseStub(channel)
        self._maintenance = rpc.MaintenanceStub(channel)
        self._auth = rpc.AuthStub(channel)
        self.watch_stub = rpc.WatchStub(channel)

    @classmethod
    async def connect(cls, settings: EtcdSettings, check: bool = True) -> EtcdClient:
        """Open a channel; with ``check``, fail now with EtcdUnavailable if etcd does not answer."""
        target, tls = _channel_target(settings.endpoints)
        options = [
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.lb_policy_name", "pick_first"),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
        ]
        channel = (
            grpc.aio.secure_channel(target, cls._credentials(settings), options=options)
            if tls or settings.ca_file
            else grpc.aio.insecure_channel(target, options=options)
        )
        login = (settings.user, settings.password) if settings.user else None
        client = cls(channel, settings.timeout, login)
        try:
            if check:
                await client.status()
                await client.auth_metadata()  # wrong credentials fail at start, not later
        except BaseException:
            await channel.close()
            raise
        return client

    @staticmethod
    def _credentials(settings: EtcdSettings) -> grpc.ChannelCredentials:
        ca = _read_file(settings.ca_file, "ca_file") if settings.ca_file else None
        cert = _read_file(settings.cert_file, "cert_file") if settings.cert_file else None
        key = _read_file(settings.key_file, "key_file") if settings.key_file else None
        return grpc.ssl_channel_credentials(ca, key, cert)

    @property
    def user(self) -> str:
        return self._login[0] if self._login else ""

    async def auth_metadata(self) -> Metadata:
        """The metadata for the next call: authenticates first if no token is held yet."""
        if self._login and not self._metadata:
            await self.renew_token(())
        return self._metadata

    async def renew_token(self, stale: Metadata) -> bool:
        """Replace the token ``stale`` with a new one; False without credentials.

        Callers that saw the same stale token wait for one Authenticate instead of each
        sending their own.
        """
        if self._login is None:
            return False
        async with self._auth_lock:
            if self._metadata == stale:
                self._metadata = await self._authenticate(*self._login)
        return True

    async def _authenticate(self, user: str, password: str) -> Metadata:
        request = rpc.AuthenticateRequest(name=user, password=password)
        try:
            response = await self._auth.Authenticate(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise authentication_error(exc, user) from exc
        self.authentications += 1
        log.info("etcd.authenticated", user=user)
        return (("token", str(response.token)),)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: Any, request: Any, what: What) -> Any:
        return await self._authed(
            what, lambda metadata: method(request, timeout=self._timeout, metadata=metadata)
        )

    async def _authed(self, what: What, attempt: Callable[[Metadata], Awaitable[T]]) -> T:
        """Run ``attempt`` with the current token; once more with a new one if it was stale."""
        metadata = await self.auth_metadata()
        try:
            return await attempt(metadata)
        except grpc.aio.AioRpcError as exc:
            if not (self._login and token_rejected(exc)):
                raise translate(exc, _name(what), self.user) from exc
        log.info("etcd.token_rejected", user=self.user, call=_name(what))
        await self.renew_token(metadata)
        try:
            return await attempt(self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, _name(what), self.user) from exc

    async def auth_rpc(self, name: str, request: Any, what: str) -> Any:
        """One call of etcd's Auth service (user and role management), e.g. ``"UserAdd"``."""
        return await self._call(getattr(self._auth, name), request, what)

    async def status(self) -> int:
        """Return the cluster's current revision; raises EtcdUnavailable if unreachable."""
        response = await self._call(self._maintenance.Status, rpc.StatusRequest(), "status")
        return int(response.header.revision)

    async def get(self, key: str) -> KeyValue | None:
        request = rpc.RangeRequest(key=key.encode())
        response = await self._call(self._kv.Range, request, f"get {key}")
        return _to_kv(response.kvs[0]) if response.kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """All keys under ``prefix`` at one consistent revision, fetched in pages."""
        end = prefix_end(prefix)
        start = prefix.encode()
        revision = 0
        items: list[KeyValue] = []
        while True:
            request = rpc.RangeRequest(key=start, range_end=end, limit=PAGE_SIZE, revision=revision)
            response = await self._call(self._kv.Range, request, f"list {prefix}")
            revision = revision or int(response.header.revision)
            items.extend(_to_kv(kv) for kv in response.kvs)
            if not response.more:
                return items, revision
            start = response.kvs[-1].key + b"\0"

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        request = rpc.PutRequest(key=key.encode(), value=value, lease=lease)
        response = await self._call(self._kv.Put, request, f"put {key}")
        return int(response.header.revision)

    async def delete(self, key: str) -> bool:
        request = rpc.DeleteRangeRequest(key=key.encode())
        response = await self._call(self._kv.DeleteRange, request, f"delete {key}")
        return bool(response.deleted)

    async def delete_prefix(self, prefix: str) -> int:
        request = rpc.DeleteRangeRequest(key=prefix.encode(), range_end=prefix_end(prefix))
        response = await self._call(self._kv.DeleteRange, request, f"delete {prefix}*")
        return int(response.deleted)

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> tuple[bool, int]:
        """Run a transaction; returns (whether the guards held, revision after it)."""
        request = rpc.TxnRequest(
            compare=[c.message for c in compare],
            success=[o.message for o in success],
            failure=[o.message for o in failure],
        )
        response = await self._call(self._kv.Txn, request, lambda: _txn_what(request))
        return bool(response.succeeded), int(response.header.revision)

    async def create_if_absent(self, key: str, value: bytes, lease: int = 0) -> bool:
        """Put ``key`` only if it does not exist; True if this call created it."""
        created, _ = await self.txn([key_absent(key)], [put_op(key, value, lease)])
        return created

    async def put_if_mod_revision(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Compare-and-swap on the key's mod revision (0 means "must not exist")."""
        guard = key_absent(key) if mod_revision == 0 else mod_revision_is(key, mod_revision)
        swapped, _ = await self.txn([guard], [put_op(key, value)])
        return swapped

    async def compact(self, revision: int) -> None:
        request = rpc.CompactionRequest(revision=revision, physical=True)
        await self._call(self._kv.Compact, request, "compact")

    async def grant_lease(self, ttl: int) -> Lease:
        response = await self._call(self._lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl), "lease")
        if response.error:
            raise PermanentError(f"etcd lease grant: {response.error}")
        return Lease(self, int(response.ID), int(response.TTL))

    async def revoke_lease(self, lease_id: int) -> None:
        request = rpc.LeaseRevokeRequest(ID=lease_id)
        with contextlib.suppress(PermanentError):  # already expired: nothing to revoke
            await self._call(self._lease.LeaseRevoke, request, "lease revoke")

    async def refresh_lease(self, lease_id: int) -> int:
        """One keepalive round trip; returns the remaining TTL (0 when the lease is gone)."""

        async def once(metadata: Metadata) -> int:
            call = self._lease.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
                timeout=self._timeout,
                metadata=metadata,
            )
            async for response in call:
                return int(response.TTL)
            raise EtcdUnavailable("etcd lease keepalive: stream closed without an answer")

        return await self._authed("lease keepalive", once)


def _txn_what(request: Any) -> str:
    """Names a txn by its keys, so a permission error says which key was refused."""
    names = [c.key.decode() for c in request.compare]
    for op in [*request.success, *request.failure]:
        inner = op.request_put if op.HasField("request_put") else op.request_delete_range
        names.append(inner.key.decode())
    unique = list(dict.fromkeys(names))
    shown = ", ".join(unique[:3]) + (f" and {len(unique) - 3} more" if len(unique) > 3 else "")
    return f"txn on {shown}" if shown else "txn"


class Lease:
    """A granted lease. ``keepalive()`` runs until cancelled or the lease is lost.

    A lost lease (expired because etcd or this process was unreachable longer than the TTL)
    is not silently re-granted: the keys bound to it are gone, so the owner must re-publish
    them, and ``keepalive`` raises ``LeaseLost`` to force that decision upward.
    """

    def __init__(self, client: EtcdClient, lease_id: int, ttl: int) -> None:
        self.client = client
        self.id = lease_id
        self.ttl = ttl

    async def keepalive(self) -> None:
        """Refresh every third of the TTL; LeaseLost once etcd or our own clock says it is over.

        The local deadline matters while etcd is unreachable or stalled: after one TTL without
        a refresh, etcd may already have expired the lease, so its keys cannot be trusted.
        """
        loop = asyncio.get_running_loop()
        interval = max(self.ttl / 3, 0.5)
        expires = loop.time() + self.ttl
        while True:
            await asyncio.sleep(interval)
            sent = loop.time()
            try:
                remaining = await self.client.refresh_lease(self.id)
            except EtcdUnavailable as exc:
                if loop.time() >= expires:
                    raise LeaseLost(
                        f"etcd lease {self.id:#x} not renewed for {self.ttl} s"
                    ) from exc
                log.warning("etcd.lease.keepalive_failed", lease=hex(self.id), error=str(exc))
                continue
            if remaining <= 0:
                raise LeaseLost(f"etcd lease {self.id:#x} expired")
            expires = sent + remaining

    async def revoke(self) -> None:
        await self.client.revoke_lease(self.id)


class LeaseLost(EtcdUnavailable):
    """The lease expired; keys attached to it were deleted by etcd."""
