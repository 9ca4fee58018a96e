"""The VIF source that asks the podwire controller (docs/vif-api.md) for a pooled port.

503 + ``Retry-After`` means "no port ready yet": retried until the ADD's deadline, then the
runtime gets "try again" (11). An answer the controller marks ``"retryable": false`` (the 4xx:
unknown or foreign network or SG, ambiguous name, network down or without subnet, subnet full,
physnet not served) is permanent and its message is passed on (code 7), because it names what
to fix; a refused token is a configuration error of this node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp

from podwire import keys
from podwire.errors import ConfigError, PermanentError, RetryableError, ValidationError
from podwire.log import get_logger
from podwire.schema import doc, fields
from podwire.schema.vif import Vif, VifRequest

log = get_logger(__name__)

# A node's whole attachment list: ~1 KiB per VIF, a few thousand pods at most.
MAX_ANSWER = 16 << 20

MAX_RETRY_AFTER = 5.0
T = TypeVar("T")


class ControllerUnavailable(RetryableError):
    """The controller did not answer, answered 5xx, or had no port ready in time."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ControllerRefused(PermanentError):
    """The controller refused the request (4xx); the message names the problem."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ControllerVifSource:
    """Talks to one controller at a time; an unavailable one (down, or the standby answering
    503) makes the next call go to the next endpoint in ``agent.controller_url``."""

    def __init__(
        self, base_urls: str, node: str, token: str, timeout: float = 10.0, retry_delay: float = 0.2
    ) -> None:
        suffix = f"/v1/nodes/{quote(node, safe='')}/vifs"
        self._bases = [url.strip().rstrip("/") + suffix for url in base_urls.split(",")]
        self._current = 0
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._retry_delay = retry_delay
        self._session: aiohttp.ClientSession | None = None
        # attachment -> port id of this node's checkpoint: settles the controller's disputes
        # (a port several attachments hold after a restore: the checkpoint's keeps it).
        self.claims: Callable[[], Mapping[str, str]] | None = None

    @property
    def _base(self) -> str:
        return self._bases[self._current]

    def _failover(self) -> None:
        if len(self._bases) > 1:
            self._current = (self._current + 1) % len(self._bases)
            log.info("agent.controller.failover", endpoint=self._base)

    async def _on_any(self, call: Callable[[], Awaitable[T]]) -> T:
        """Try each endpoint once, starting with the current one."""
        for _ in range(len(self._bases) - 1):
            try:
                return await call()
            except ControllerUnavailable:
                self._failover()
        return await call()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, req: VifRequest, deadline: float) -> Vif:
        body = req.to_json()
        loop = asyncio.get_running_loop()
        while True:
            try:
                return await self._post(body)
            except ControllerUnavailable as exc:
                self._failover()
                delay = min(exc.retry_after or self._retry_delay, MAX_RETRY_AFTER)
                if loop.time() + delay >= deadline:
                    raise
                log.info("agent.vif.retry", attachment=req.attachment, error=str(exc), delay=delay)
                await asyncio.sleep(delay)

    async def _post(self, body: dict[str, Any]) -> Vif:
        try:
            async with self._client().post(self._base, json=body) as resp:
                payload = await _json(resp)
                if resp.status == 200:
                    return _vif(payload)
                raise _error(resp, payload)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(self._base, exc, self._timeout.total) from exc

    async def release(self, attachment: str, vif: Vif | None) -> None:
        if not nameable(attachment):
            # The VIF API refuses such a name, so it never handed a VIF out under it: there
            # is nothing to release, and the runtime's DEL (e.g. after a failed ADD) succeeds.
            log.info("agent.vif.release_skipped", attachment=attachment, reason="no VIF API name")
            return
        await self._on_any(lambda: self._delete(attachment))

    async def _delete(self, attachment: str) -> None:
        url = f"{self._base}/{quote(attachment, safe='')}"
        try:
            async with self._client().delete(url) as resp:
                if resp.status in (200, 204, 404):
                    return
                raise _error(resp, await _json(resp))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(url, exc, self._timeout.total) from exc

    async def attachments(self) -> dict[str, Vif]:
        return await self._on_any(self._list)

    async def held(self) -> set[str]:
        return set(await self.attachments())

    async def _list(self) -> dict[str, Vif]:
        try:
            async with self._client().get(self._base) as resp:
                payload = await _json(resp)
                if resp.status != 200:
                    raise _error(resp, payload)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(self._base, exc, self._timeout.total) from exc
        items = payload.get("attachments")
        if not isinstance(items, dict):
            raise ControllerUnavailable("controller: 'attachments' missing from the answer")
        # Keys in canonical form, so records from before the ``<container>:<ifname>`` ids match.
        found = {
            fields.attachment(key, "controller attachment"): Vif.from_json(value)
            for key, value in items.items()
        }
        for attachment in await self._settle(payload.get("disputed")):
            found.pop(attachment, None)
        return found

    async def _settle(self, disputed: Any) -> list[str]:
        """Release the attachments of a disputed port that the checkpoint does not name
        (the one it names keeps the port); returns them. Nothing when the checkpoint names
        none of them: then the runtime's DEL or GC decides."""
        if not isinstance(disputed, dict) or not disputed or self.claims is None:
            return []
        claims = self.claims()
        released = []
        for port_id, attachments in disputed.items():
            if not isinstance(attachments, list):
                continue
            named = [a for a in attachments if isinstance(a, str) and claims.get(a) == port_id]
            if not named:
                continue
            for attachment in attachments:
                if attachment not in named and nameable(attachment):
                    log.warning(
                        "agent.vif.duplicate_released",
                        port=port_id,
                        attachment=attachment,
                        kept=named,
                    )
                    await self._delete(attachment)
                    released.append(attachment)
        return released

    async def healthy(self) -> tuple[bool, str]:
        try:
            await self.attachments()
        except ControllerRefused as exc:
            return False, f"controller refused us: {exc}"
        except (ControllerUnavailable, ValidationError) as exc:
            return False, f"controller: {exc}"
        return True, "controller reachable"


async def _json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    try:
        payload = doc.decode(await resp.read(), "controller answer", MAX_ANSWER)
    except ValidationError:
        return {}
    return payload if isinstance(payload, dict) else {}


def _vif(payload: dict[str, Any]) -> Vif:
    try:
        return Vif.from_json(payload.get("vif"))
    except ValidationError as exc:
        raise ControllerUnavailable(f"controller sent a malformed VIF: {exc}") from exc


# The controller's causes that say this node's token is wrong (not the request).
TOKEN_CAUSES = frozenset({"unauthorized", "wrong_node"})


def _error(resp: aiohttp.ClientResponse, payload: dict[str, Any]) -> Exception:
    """The controller's answer as podwire's error: ``retryable`` (or a 5xx, 408, 429 from
    whatever answered) is worth a retry, anything else is permanent and its message says what
    to fix (docs/vif-api.md names the causes)."""
    message = str(payload.get("error") or resp.reason or "no message")
    cause = payload.get("cause")
    if resp.status == 401 or (resp.status == 403 and cause in (None, *TOKEN_CAUSES)):
        return ConfigError(f"controller refused agent.token (HTTP {resp.status}): {message}")
    retryable = payload.get("retryable")
    if retryable is True or (
        retryable is None and (resp.status >= 500 or resp.status in (408, 429))
    ):
        return ControllerUnavailable(
            f"controller: HTTP {resp.status}: {message}", _retry_after(resp)
        )
    return ControllerRefused(f"controller: HTTP {resp.status}: {message}", resp.status)


def _unreachable(url: str, exc: BaseException, timeout: float | None) -> ControllerUnavailable:
    """A transport failure, named: a time-out has no message of its own."""
    if isinstance(exc, TimeoutError) and not str(exc):
        detail = f"no answer within {timeout:.0f} s" if timeout else "no answer in time"
    else:
        detail = str(exc) or type(exc).__name__
    return ControllerUnavailable(f"controller at {url}: {detail}")


def nameable(attachment: str) -> bool:
    """Whether the VIF API can name this attachment (one key segment, as it checks)."""
    try:
        keys.check_segment(attachment, "attachment")
    except ValueError:
        return False
    return True


def _retry_after(resp: aiohttp.ClientResponse) -> float:
    try:
        return max(0.0, float(resp.headers.get("Retry-After", "0.2")))
    except ValueError:
        return 0.2
