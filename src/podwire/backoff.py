"""Retry timing in one place: a doubling delay with a cap, and a loop that restarts retryable work.

Every retry loop waits through ``Backoff``, so a stalled etcd or Neutron is polled at one bounded
pace everywhere: no busy loop during an outage, and no delay that grows past ``maximum``, which
bounds how long a component lags behind a dependency that came back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from podwire.errors import PodwireError, RetryableError
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
