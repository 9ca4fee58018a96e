"""How many ready ports a pool should hold: learned from its drain rate and Neutron's speed.

A fixed ``pool.min`` is either too small for a burst (requests wait for a ~seconds-long bulk
create) or wasteful on idle nodes. With ``pool.adaptive`` each pool key learns how fast it
drains: requests minus ports that came back from a release, because a recycled port serves the
next request like a new one (an exponentially weighted average over fixed windows, so one quiet
second does not forget a burst and a sudden step is seen within one window). It keeps enough
ready ports to serve that drain until a refill started now would land (the measured bulk-create
latency), times a headroom for the burst's variance. Counting requests alone made steady churn
(pods created and deleted at the same pace) order ever more ports while the released ones
already covered it. Nor does it exceed the most ports the pool had out at once (in use,
from its requests and releases) since it was last idle: a short burst reads as a high rate,
and on a slow Neutron (whose bulk creates slow down as the pool orders more) rate x refill
time grew without bound, a 30-pod burst repeated every 20 s once asked for 375 ports; with
that many ready, a repeat of the largest burst is served without waiting, and a pool held at
twice that kept ordering ports for every later burst of the same size. A pool that saw no
request for ``pool.idle_ttl`` seconds falls back to ``pool.min`` and its surplus is deleted.
The target never leaves ``[pool.min, pool.max]``.

Pure bookkeeping with the clock passed in: no I/O, so its rules are unit tested exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from podwire.config import PoolSettings

K = TypeVar("K")

# Until the first refill is measured: about one bulk of 10 ports in the real Neutron here.
DEFAULT_LEAD_SECONDS = 2.0
LEAD_SMOOTHING = 0.3  # weight of a new bulk-create measurement in the lead-time average


@dataclass(frozen=True)
class Target:
    """A pool's wanted number of ready ports, and the reason an operator reads."""

    size: int
    reason: str
    rate: float  # drain (requests minus returned ports) per second the target is based on
    lead: float  # seconds a refill takes (measured)

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.size,
            "reason": self.reason,
            "rate": round(self.rate, 3),
            "lead_seconds": round(self.lead, 3),
        }


def clamp(value: int, settings: PoolSettings) -> int:
    """``value`` within [min, max] (max 0: no upper limit)."""
    value = max(value, settings.min)
    return min(value, settings.max) if settings.max else value


def compute_target(
    rate: float,
    lead: float,
    idle_for: float | None,
    settings: PoolSettings,
    peak: int | None = None,
) -> Target:
    """The target for a pool drained at ``rate`` ports/s, ``idle_for`` s after its last request.

    ``idle_for`` is None for a pool that never had a request.
    """
    if not settings.adaptive:
        return Target(settings.min, "fixed: pool.adaptive is off", rate, lead)
    if idle_for is None:
        return Target(settings.min, "no request yet: pool.min", 0.0, lead)
    if idle_for >= settings.idle_ttl:
        return Target(
            settings.min,
            f"idle {idle_for:.0f} s >= pool.idle_ttl {settings.idle_ttl:g} s: pool.min",
            0.0,
            lead,
        )
    burst = math.ceil(rate * lead * settings.headroom)
    reason = f"drain {rate:.2f}/s x refill {lead:.2f} s x headroom {settings.headroom:g} = {burst}"
    if peak is not None and burst > peak:
        burst = peak
        reason += f", held at {peak} (the most ports out at once)"
    size = clamp(burst, settings)
    if size != burst:
        bound = "pool.min" if size == settings.min else "pool.max"
        reason += f", held at {bound} {size}"
    return Target(size, reason, rate, lead)


def step_toward(target: int, size: int, batch: int) -> int:
    """What one refill fills the pool to: the target, but at most twice the pool plus one
    batch. A spike of concurrent requests reads as a very high rate; growing by doubling
    still reaches a sustained burst's target within a few refills without sending Neutron a
    hundred ports for a spike that is over before they land."""
    return min(target, 2 * size + batch)


@dataclass
class RateWindow:
    """A pool's drain (requests minus returns) counted per window, folded into an average when
    a window ends."""

    window: float
    smoothing: float
    started: float = 0.0  # start of the current window
    count: int = 0  # requests minus returns in the current window
    average: float = 0.0  # drain per second over the finished windows (<= 0 counts as 0)
    last_request: float | None = None
    last_change: float | None = None  # a request, a release or a returned port
    out: int = 0  # ports in use: requests not offset by a release
    peak: int = 0  # the most ``out`` since the pool was last idle
    before: float = 0.0  # the average before the last finished window was folded in

    def observe(self, now: float) -> None:
        self._roll(now)
        self.count += 1
        self.last_request = self.last_change = now
        self.out += 1
        self.peak = max(self.peak, self.out)

    def released(self, now: float) -> None:
        """A port is no longer in use (recycled or deleted, whichever follows)."""
        self.last_change = now
        self.out = max(self.out - 1, 0)  # a port recovered in use was never counted out

    def returned(self, now: float) -> None:
        """A released port is back: it offsets one request (it is not one)."""
        self._roll(now)
        self.count -= 1
        self.last_change = now

    def rate(self, now: float) -> float:
        """The learned drain; a step up counts at once (the current window's pace so far,
        over at least half a window, so the first request is not an infinite rate)."""
        self._roll(now)
        elapsed = max(now - self.started, self.window / 2)
        return max(self.average, self.count / elapsed, 0.0)

    def sustained(self, now: float) -> float:
        """A drain that has lasted: the lower of the average and the average before the last
        finished window, so a burst that ends within two windows counts as none."""
        self._roll(now)
        return min(self.average, self.before)

    def _roll(self, now: float) -> None:
        ended = int((now - self.started) // self.window)
        if ended <= 0:
            return
        keep = 1 - self.smoothing
        self.before = self.average * keep ** (ended - 1)
        self.average = self.average * keep + (self.count / self.window) * self.smoothing
        self.average *= keep ** (ended - 1)  # windows without a request count as zero
        if self.average < 1e-3:
            self.average = 0.0
        self.count = 0
        self.started += ended * self.window


@dataclass
class PoolSizer(Generic[K]):
    """The rate of every pool key and one lead time for all (Neutron is shared)."""

    settings: PoolSettings
    lead: float = DEFAULT_LEAD_SECONDS
    measured: int = 0  # bulk creates measured so far
    _rates: dict[K, RateWindow] = field(default_factory=dict)
    _first_seen: dict[K, float] = field(default_factory=dict)

    def request(self, key: K, now: float) -> None:
        window = self._window(key, now)
        if window.last_request is not None and now - window.last_request >= self.settings.idle_ttl:
            window.peak = window.out  # an idle pool forgets its old peak
        window.observe(now)

    def released(self, key: K, now: float) -> None:
        self._window(key, now).released(now)

    def returned(self, key: K, now: float) -> None:
        self._window(key, now).returned(now)

    def bulk_created(self, seconds: float) -> None:
        """One bulk create (a batch) took ``seconds``: the time a refill needs to land."""
        if self.measured == 0:
            self.lead = seconds
        else:
            self.lead = self.lead * (1 - LEAD_SMOOTHING) + seconds * LEAD_SMOOTHING
        self.measured += 1

    def target(self, key: K, now: float) -> Target:
        window = self._rates.get(key)
        if window is None or window.last_request is None:
            return compute_target(0.0, self.lead, None, self.settings)
        idle_for = now - window.last_request
        return compute_target(window.rate(now), self.lead, idle_for, self.settings, window.peak)

    def idle_for(self, key: K, now: float) -> float:
        """Seconds since the pool's last request, or since the sizer first saw the pool (a
        populated or recovered pool that never gets a request shrinks after the TTL too)."""
        window = self._rates.get(key)
        if window is not None and window.last_request is not None:
            return now - window.last_request
        return now - self._first_seen.setdefault(key, now)

    def quiet_for(self, key: K, now: float) -> float:
        """Seconds since the pool last saw a request, a release or a returned port (inf:
        never)."""
        window = self._rates.get(key)
        if window is None or window.last_change is None:
            return math.inf
        return now - window.last_change

    def reserve(self, key: K, now: float) -> int:
        """Ready ports the pool's sustained drain (the averaged windows, not the current
        window's pace) takes while a refill started now lands: below it a top-up cannot wait
        for the requests to pause. A sudden burst is served from the pool first."""
        window = self._rates.get(key)
        if window is None:
            return 0
        return math.ceil(window.sustained(now) * self.lead)

    def surplus(self, key: K, size: int, now: float) -> int:
        """Free ports to delete: what exceeds the target once the pool has been idle for
        ``pool.idle_ttl``; 0 for a busy pool (a burst's recycled ports serve its next wave)."""
        if not self.settings.adaptive or self.idle_for(key, now) < self.settings.idle_ttl:
            return 0
        return max(size - self.target(key, now).size, 0)

    def forget(self, key: K) -> None:
        self._rates.pop(key, None)
        self._first_seen.pop(key, None)

    def _window(self, key: K, now: float) -> RateWindow:
        window = self._rates.get(key)
        if window is None:
            window = RateWindow(self.settings.rate_window, self.settings.rate_smoothing, now)
            self._rates[key] = window
        return window
