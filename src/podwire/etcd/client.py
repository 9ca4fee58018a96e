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

A client may carry a namespace (a deployment's, see ``schema.deployment``): it is prepended to
every key on the way out and removed on the way back, as etcd's own namespace proxy does, so
callers build keys with ``podwire.keys`` whichever deployment they belong to.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import grpc
from aetcd import rpc

from podwire.config import EtcdSettings
from podwire.errors import ConfigError, EtcdUnavailable, PermanentError
from podwire.etcd.errors import authentication_error, token_rejected, translate
from podwire.log import get_logger

log = get_logger(__name__)

PAGE_SIZE = 1000
MAX_TXN_OPS = 100  # operations a caller puts in one transaction: etcd's default limit is 128

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


def _channel_targets(endpoints: Sequence[str]) -> tuple[list[str], bool]:
    """One gRPC target per endpoint (the client fails over between them itself)."""
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
    return hosts, schemes == {"https"}


class Endpoint:
    """One member's channel and stubs; ``index`` is its place in ``etcd.endpoints``."""

    def __init__(self, index: int, target: str, channel: grpc.aio.Channel) -> None:
        self.index = index
        self.target = target
        self.channel = channel
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.maintenance = rpc.MaintenanceStub(channel)
        self.auth = rpc.AuthStub(channel)
        self.watch = rpc.WatchStub(channel)


def _read_file(path: str, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"etcd.{key}: cannot read {path}: {exc.strerror}") from exc


class EtcdClient:
    """An open connection to an etcd cluster. Create with ``await EtcdClient.connect(...)``.

    Calls go to one member at a time (the *active* endpoint). A member that does not answer
    (connection refused or reset, a deadline passed, "no leader") makes the client move to the
    next one: reads are repeated there at once; writes only when etcd cannot have applied them
    (the member was unreachable or had no leader), else the caller's retry repeats them. A
    stopped member thus costs one call its deadline, not every call until TCP notices.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        timeout: float,
        login: tuple[str, str] | None = None,
        namespace: str = "",
        owns_channels: bool = True,
    ) -> None:
        self._endpoints = list(endpoints)
        self._namespace = namespace.encode()
        self._owns_channels = owns_channels
        self._active = 0
        self._timeout = timeout
        self._login = login
        self._metadata: Metadata = ()
        self._auth_lock = asyncio.Lock()

    @classmethod
    async def connect(
        cls, settings: EtcdSettings, check: bool = True, namespace: str = ""
    ) -> EtcdClient:
        """Open the channels; with ``check``, fail now with EtcdUnavailable if etcd does not
        answer."""
        targets, tls = _channel_targets(settings.endpoints)
        options = [
            # etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
            ("grpc.keepalive_time_ms", 5_000),
            ("grpc.keepalive_timeout_ms", 3_000),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
            # Also the connect timeout: a stopped member must not hold a call for 20 s.
            ("grpc.min_reconnect_backoff_ms", 2_000),
        ]
        secure = tls or bool(settings.ca_file)
        credentials = cls._credentials(settings) if secure else None
        endpoints = [
            Endpoint(
                i,
                target,
                grpc.aio.secure_channel(target, credentials, options=options)
                if credentials is not None
                else grpc.aio.insecure_channel(target, options=options),
            )
            for i, target in enumerate(targets)
        ]
        login = (settings.user, settings.password) if settings.user else None
        client = cls(endpoints, settings.timeout, login, namespace)
        try:
            if check:
                await client.status()
                await client.auth_metadata()  # wrong credentials fail at start, not later
        except BaseException:
            await client.close()
            raise
        return client

    def within(self, namespace: str) -> EtcdClient:
        """A client on the same channels whose keys live under ``namespace`` (the ml2 driver
        serves several deployments over one connection); closing it leaves them open."""
        return EtcdClient(self._endpoints, self._timeout, self._login, namespace, False)

    @property
    def namespace(self) -> str:
        return self._namespace.decode()

    def raw_key(self, key: str) -> bytes:
        """``key`` as etcd stores it: with this client's namespace in front."""
        return self._namespace + key.encode()

    def logical_key(self, raw: bytes) -> str:
        """A key etcd sent, without this client's namespace."""
        return raw[len(self._namespace) :].decode()

    def _kv(self, kv: Any) -> KeyValue:
        return KeyValue(
            key=self.logical_key(kv.key),
            value=bytes(kv.value),
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            version=kv.version,
            lease=kv.lease,
        )

    def raw_range(self, prefix: str) -> tuple[bytes, bytes]:
        """The key range of everything under ``prefix``, as etcd stores it."""
        return self.raw_key(prefix), prefix_end(self.namespace + prefix)

    @property
    def endpoint(self) -> Endpoint:
        """The member calls go to now."""
        return self._endpoints[self._active]

    def failed(self, endpoint: Endpoint, error: str) -> None:
        """``endpoint`` did not answer: the next call goes to the next member (once per
        failure, however many callers saw it)."""
        if len(self._endpoints) == 1 or endpoint.index != self._active:
            return
        self._active = (self._active + 1) % len(self._endpoints)
        log.warning(
            "etcd.failover", left=endpoint.target, to=self.endpoint.target, error=error[:200]
        )

    async def probe(self, endpoint: Endpoint, within: float) -> None:
        """EtcdUnavailable unless ``endpoint`` answers a Status call within ``within`` s."""
        try:
            await endpoint.maintenance.Status(rpc.StatusRequest(), timeout=within)
        except grpc.aio.AioRpcError as exc:
            self.failed(endpoint, exc.details() or exc.code().name)
            raise translate(exc, f"status of {endpoint.target}", self.user) from exc

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
        for attempt in range(len(self._endpoints)):
            endpoint = self.endpoint
            try:
                response = await endpoint.auth.Authenticate(request, timeout=self._timeout)
                break
            except grpc.aio.AioRpcError as exc:
                error = authentication_error(exc, user)
                if not isinstance(error, EtcdUnavailable) or attempt == len(self._endpoints) - 1:
                    raise error from exc
                self.failed(endpoint, str(error))
        log.info("etcd.authenticated", user=user)
        return (("token", str(response.token)),)

    async def close(self) -> None:
        if not self._owns_channels:
            return
        for endpoint in self._endpoints:
            await endpoint.channel.close()

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self,
        method: Callable[[Endpoint], Any],
        request: Any,
        what: What,
        read: bool = False,
        within: float | None = None,
    ) -> Any:
        """One unary call on the active member, moving to the next one when it fails to
        answer: a read at once, a write only if etcd cannot have applied it. ``within``
        shortens ``etcd.timeout`` for this call."""
        for attempt in range(len(self._endpoints)):
            endpoint = self.endpoint
            try:
                stub = method(endpoint)
                return await self._authed(what, self._unary(stub, request, within))
            except EtcdUnavailable as exc:
                cause = exc.__cause__
                self.failed(endpoint, str(exc))
                last = attempt == len(self._endpoints) - 1
                if last or not (read or _not_applied(cause)):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _unary(
        self, stub: Any, request: Any, within: float | None = None
    ) -> Callable[[Metadata], Awaitable[Any]]:
        deadline = self._timeout if within is None else min(within, self._timeout)

        def attempt(metadata: Metadata) -> Awaitable[Any]:
            return cast(Awaitable[Any], stub(request, timeout=deadline, metadata=metadata))

        return attempt

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
        return await self._call(lambda e: getattr(e.auth, name), request, what)

    async def status(self) -> int:
        """Return the cluster's current revision; raises EtcdUnavailable if unreachable."""
        response = await self._call(
            lambda e: e.maintenance.Status, rpc.StatusRequest(), "status", read=True
        )
        return int(response.header.revision)

    async def get(self, key: str) -> KeyValue | None:
        request = rpc.RangeRequest(key=self.raw_key(key))
        response = await self._call(lambda e: e.kv.Range, request, f"get {key}", read=True)
        return self._kv(response.kvs[0]) if response.kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """All keys under ``prefix`` at one consistent revision, fetched in pages."""
        start, end = self.raw_range(prefix)
        revision = 0
        items: list[KeyValue] = []
        while True:
            request = rpc.RangeRequest(key=start, range_end=end, limit=PAGE_SIZE, revision=revision)
            response = await self._call(lambda e: e.kv.Range, request, f"list {prefix}", read=True)
            revision = revision or int(response.header.revision)
            items.extend(self._kv(kv) for kv in response.kvs)
            if not response.more:
                return items, revision
            start = response.kvs[-1].key + b"\0"

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        request = rpc.PutRequest(key=self.raw_key(key), value=value, lease=lease)
        response = await self._call(lambda e: e.kv.Put, request, f"put {key}")
        return int(response.header.revision)

    async def delete(self, key: str) -> bool:
        request = rpc.DeleteRangeRequest(key=self.raw_key(key))
        response = await self._call(lambda e: e.kv.DeleteRange, request, f"delete {key}")
        return bool(response.deleted)

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
        within: float | None = None,
    ) -> tuple[bool, int]:
        """Run a transaction; returns (whether the guards held, revision after it).

        ``within`` seconds (at most ``etcd.timeout``) suits a caller that repeats an idempotent
        write: a proposal a member forwarded to a leader that just died is never answered, and
        only the deadline ends the wait."""
        request = rpc.TxnRequest(
            compare=[c.message for c in compare],
            success=[o.message for o in success],
            failure=[o.message for o in failure],
        )
        if self._namespace:
            _prefix_keys(request, self._namespace)
        response = await self._call(
            lambda e: e.kv.Txn, request, lambda: _txn_what(request), within=within
        )
        return bool(response.succeeded), int(response.header.revision)

    async def create_if_absent(self, key: str, value: bytes, lease: int = 0) -> bool:
        """Put ``key`` only if it does not exist; True if this call created it."""
        created, _ = await self.txn([key_absent(key)], [put_op(key, value, lease)])
        return created

    async def grant_lease(self, ttl: int) -> Lease:
        response = await self._call(
            lambda e: e.lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl), "lease"
        )
        if response.error:
            raise PermanentError(f"etcd lease grant: {response.error}")
        return Lease(self, int(response.ID), int(response.TTL))

    async def revoke_lease(self, lease_id: int) -> None:
        request = rpc.LeaseRevokeRequest(ID=lease_id)
        with contextlib.suppress(PermanentError):  # already expired: nothing to revoke
            await self._call(lambda e: e.lease.LeaseRevoke, request, "lease revoke")

    async def refresh_lease(self, lease_id: int) -> int:
        """One keepalive round trip; returns the remaining TTL (0 when the lease is gone)."""

        endpoint = self.endpoint

        async def once(metadata: Metadata) -> int:
            call = endpoint.lease.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
                timeout=self._timeout,
                metadata=metadata,
            )
            async for response in call:
                return int(response.TTL)
            raise EtcdUnavailable("etcd lease keepalive: stream closed without an answer")

        try:
            return await self._authed("lease keepalive", once)
        except EtcdUnavailable as exc:
            self.failed(endpoint, str(exc))
            raise


def _not_applied(cause: BaseException | None) -> bool:
    """Whether a failed write cannot have been applied: the member was not reachable (no
    connection) or had no leader to propose to. A deadline or a reset mid-call may have
    been applied, so such a write is left to the caller's retry."""
    if not isinstance(cause, grpc.aio.AioRpcError):
        return False
    detail = (cause.details() or "").lower()
    if "no leader" in detail:
        return True
    return cause.code() == grpc.StatusCode.UNAVAILABLE and (
        "connect" in detail or "no address" in detail or "refused" in detail
    )


def _prefix_keys(request: Any, namespace: bytes) -> None:
    """Put ``namespace`` in front of every key of a txn (its messages are the request's own
    copies, so shared guards and ops stay as built)."""
    for compare in request.compare:
        compare.key = namespace + compare.key
    for op in [*request.success, *request.failure]:
        inner = op.request_put if op.HasField("request_put") else op.request_delete_range
        inner.key = namespace + inner.key


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

    async def keepalive(self, after_refresh: Callable[[], Awaitable[None]] | None = None) -> None:
        """Refresh every third of the TTL; LeaseLost once etcd or our own clock says it is over.

        The local deadline matters while etcd is unreachable or stalled: after one TTL without
        a refresh, etcd may already have expired the lease, so its keys cannot be trusted.
        ``after_refresh`` runs after each refresh (a heartbeat value only its owner can write:
        etcd lets anyone refresh any lease).
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
            if after_refresh is not None:
                try:
                    await after_refresh()
                except EtcdUnavailable as exc:  # the next refresh tries again
                    log.warning("etcd.lease.beat_failed", lease=hex(self.id), error=str(exc))

    async def revoke(self) -> None:
        await self.client.revoke_lease(self.id)


class LeaseLost(EtcdUnavailable):
    """The lease expired; keys attached to it were deleted by etcd."""
