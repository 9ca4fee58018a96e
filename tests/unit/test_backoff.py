"""The one backoff: doubling, capped, reset; the restart loop retries only what is retryable."""

from __future__ import annotations

import pytest

from podwire.backoff import Backoff, retry_forever
from podwire.errors import ConfigError, EtcdUnavailable
from podwire.health import Health, first_problem


def test_delays_double_up_to_the_cap_and_reset() -> None:
    backoff = Backoff(0.1, 1.0)
    assert [backoff.next() for _ in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    backoff.reset()
    assert backoff.next() == pytest.approx(0.1)
    assert backoff.delay(10_000) == 1.0  # no overflow however long the outage


def test_bad_timing_is_refused() -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError, match="backoff"):
        Backoff(2.0, 1.0)


async def test_retry_forever_restarts_retryable_work_and_reports_it() -> None:
    health = Health("job")
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise EtcdUnavailable("etcd get: deadline exceeded")

    await retry_forever("job", job, Backoff(0.001, 0.01), health)
    assert calls == 3
    assert first_problem([health]) == "job: etcd get: deadline exceeded"  # the job clears it
    health.ok()
    assert first_problem([health]) is None


async def test_retry_forever_lets_a_permanent_error_out() -> None:
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        raise ConfigError("etcd.endpoints: bad")

    with pytest.raises(ConfigError):
        await retry_forever("job", job, Backoff(0.001, 0.01))
    assert calls == 1
