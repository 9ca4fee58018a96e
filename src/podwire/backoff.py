"""Retry timing in one place: a doubling delay with a cap, and a loop that restarts retryable work.

Every retry loop waits through ``Backoff``, so a stalled etcd or Neutron is polled at one bounded
pace everywhere: no busy loop during an outage, and no delay that grows past ``maximum``, which
bounds how long a component lags behind a dependency that came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from podwire.errors import ConfigError, PodwireError, RetryableError
from podwire.health import Health
from podwire.log import get_logger

log = get_logger(__name__)

_MAX_ATTEMPT = 64  # factor ** attempt stays a finite float


@dataclass
class Backoff:
    initial: float = 0.1
    maximum: float = 5.0
    factor: float = 2.0
    _attempt: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.factor < 1:
            raise ValueError(f"backoff: bad timing {self.initial}/{self.maximum}/{self.factor}")

    def delay(self, attempt: int) -> float:
        """The wait before retry number ``attempt`` (0 is the first retry)."""
        return min(self.initial * self.factor ** min(attempt, _MAX_ATTEMPT), self.maximum)

    def next(self) -> float:
        delay = self.delay(self._attempt)
        self._attempt += 1
        return delay

    def reset(self) -> None:
        self._attempt = 0

    async def sleep(self) -> float:
        delay = self.next()
        await asyncio.sleep(delay)
        return delay


async def passes_on_wake(
    one_pass: Callable[[], Awaitable[float | None]],
    wake: asyncio.Event,
    backoff: Backoff,
    on_retry: Callable[[PodwireError, float], None],
) -> None:
    """A pass at once, then one after every ``wake`` (or once the delay a pass returned is
    over, if it returned one); a pass that fails with a PodwireError is told to ``on_retry``
    (with the delay) and tried again after ``backoff``'s delay, or at the next wake."""
    while True:
        wake.clear()
        try:
            delay = await one_pass()
            backoff.reset()
        except PodwireError as exc:
            delay = backoff.next()
            on_retry(exc, delay)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await wake.wait()


async def retry_forever(
    what: str,
    job: Callable[[], Awaitable[None]],
    backoff: Backoff,
    health: Health | None = None,
    retried: type[PodwireError] = RetryableError,
) -> None:
    """Run ``job`` until it returns, restarting it after each RetryableError.

    A permanent error leaves, so the process stops on what repeating cannot fix; a part
    whose failure must not stop the process around it (the device plugin inside the agent)
    passes ``retried=PodwireError``. A run that lasted longer than the longest delay counts as
    a success: the next failure starts the backoff over instead of waiting the maximum at once.
    """
    while True:
        started = time.monotonic()
        try:
            await job()
            return
        except retried as exc:
            if time.monotonic() - started > backoff.maximum:
                backoff.reset()
            if health is not None:
                health.failing(str(exc))
            delay = backoff.next()
            log.warning("retry.restart", what=what, error=str(exc), delay=round(delay, 3))
            await asyncio.sleep(delay)


class Supervised:
    """One long-running part of a service: run forever, and a failure nobody foresaw (a bug,
    a value from another node the part could not take) restarts it after a backoff instead
    of ending the process and every pod's CNI with it. Only a configuration error, which a
    restart cannot fix (``fatal``: a bad setting, an etcd role that does not cover a key),
    leaves. Restarts are counted and shown through ``health`` until the part has run longer
    than the longest delay again."""

    def __init__(
        self,
        name: str,
        job: Callable[[], Awaitable[None]],
        before_restart: Callable[[], None] | None = None,
        backoff: Backoff | None = None,
        fatal: tuple[type[Exception], ...] = (ConfigError,),
    ) -> None:
        self.name = name
        self._job = job
        self._fatal = fatal
        self._before_restart = before_restart
        self._backoff = backoff or Backoff(0.5, 10.0)
        self.health = Health(f"task {name}")
        self.restarts = 0
        self.last_error: str | None = None

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self._job()
                return
            except Exception as exc:  # the one place a failure is survived: logged, counted
                if _holds(exc, self._fatal):
                    raise
                self._failed(exc, time.monotonic() - started)
            await asyncio.sleep(self._backoff.next())
            if self._before_restart is not None:
                self._before_restart()
            self._clear_later(self.restarts)

    def _failed(self, exc: BaseException, ran: float) -> None:
        if ran > self._backoff.maximum:
            self._backoff.reset()
        self.restarts += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:500]
        self.health.failing(f"restarted {self.restarts} times; last: {self.last_error}")
        log.exception("task.restart", task=self.name, restarts=self.restarts)

    def _clear_later(self, restarts: int) -> None:
        def clear() -> None:
            if self.restarts == restarts:  # no failure since
                self.health.ok()

        asyncio.get_running_loop().call_later(self._backoff.maximum, clear)


def _holds(exc: BaseException, kinds: tuple[type[Exception], ...]) -> bool:
    """Whether ``exc`` is one of ``kinds``, or a task group's error holding one."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_holds(inner, kinds) for inner in exc.exceptions)
    return isinstance(exc, kinds)
