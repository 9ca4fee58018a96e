"""Whether the apiserver answers, said once per change instead of once per retry.

Three informers retry on their own backoffs: an apiserver that is down for a minute would
otherwise fill the log with a line per informer and retry, none saying more than the first.
One ``ApiReach`` is shared by the informers of one watcher: the first failure is logged as
``k8s.api.away`` naming the server and the error, retries meanwhile only at debug level, and
``k8s.api.back`` once every informer that failed has had an answer again. Readiness and the
metrics read ``problem`` and ``errors``."""

from __future__ import annotations

import time
from collections.abc import Callable

from podwire.log import get_logger

log = get_logger(__name__)


class ApiReach:
    def __init__(self, server: str, on_error: Callable[[], None] | None = None) -> None:
        self.server = server
        self.problem: str | None = None  # "<server>: <error>" while an informer fails
        self.errors = 0
        self._on_error = on_error
        self._failing: set[str] = set()
        self._since = 0.0

    @property
    def away(self) -> bool:
        return bool(self._failing)

    def failed(self, kind: str, error: str, delay: float) -> None:
        """An informer's list or watch failed; it retries after ``delay`` seconds."""
        self.errors += 1
        if self._on_error is not None:
            self._on_error()
        self.problem = f"{self.server}: {error}"
        if not self._failing:
            self._since = time.monotonic()
            log.warning("k8s.api.away", server=self.server, kind=kind, error=error, retry_in=delay)
        else:
            log.debug("k8s.watch.retry", kind=kind, error=error, delay=delay)
        self._failing.add(kind)

    def answered(self, kind: str) -> None:
        """An informer's list or watch request was answered."""
        if kind not in self._failing:
            return
        self._failing.discard(kind)
        if not self._failing:
            self.problem = None
            log.info(
                "k8s.api.back",
                server=self.server,
                away_seconds=round(time.monotonic() - self._since, 1),
            )
