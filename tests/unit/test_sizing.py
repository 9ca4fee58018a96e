"""Adaptive pool sizing (controller/sizing.py): the rules, exactly, with the clock passed in."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from podwire.config import PoolSettings
from podwire.controller.sizing import PoolSizer, RateWindow, compute_target

SETTINGS = PoolSettings(min=2, max=40, idle_ttl=10.0, rate_window=1.0, headroom=2.0)


def test_a_step_up_is_seen_within_one_window() -> None:
    window = RateWindow(window=2.0, smoothing=0.5, started=0.0)
    for i in range(5):  # 5 requests/s from t=0
        window.observe(i * 0.2)
    assert window.rate(1.0) == 5.0  # the current window's pace, before it ends


def test_returned_ports_offset_requests_so_steady_churn_orders_nothing() -> None:
    sizer: PoolSizer[str] = PoolSizer(SETTINGS)
    sizer.bulk_created(2.0)
    for i in range(50):  # 5 pods/s created, each one's port back 0.5 s later
        sizer.request("p", i * 0.2)
        if i >= 3:
            sizer.returned("p", i * 0.2 + 0.1)
    assert sizer.target("p", 10.0).size == SETTINGS.min
    growing: PoolSizer[str] = PoolSizer(SETTINGS)  # the same pods, none deleted yet
    growing.bulk_created(2.0)
    for i in range(50):
        growing.request("p", i * 0.2)
    assert growing.target("p", 10.0).size == 20


def test_the_rate_decays_through_quiet_windows_to_zero() -> None:
    window = RateWindow(window=1.0, smoothing=0.5, started=0.0)
    for i in range(10):
        window.observe(i * 0.1)
    assert window.rate(1.5) == 5.0  # 10 per window, half-weighted into the average
    assert window.rate(2.5) == 2.5  # one empty window
    assert window.rate(30.0) == 0.0


def test_target_is_rate_times_refill_time_times_headroom() -> None:
    target = compute_target(rate=5.0, lead=1.5, idle_for=0.5, settings=SETTINGS)
    assert target.size == 15
    assert target.reason == "drain 5.00/s x refill 1.50 s x headroom 2 = 15"


def test_target_is_held_inside_min_and_max() -> None:
    assert compute_target(0.1, 1.0, 0.1, SETTINGS).size == 2
    high = compute_target(100.0, 2.0, 0.1, SETTINGS)
    assert high.size == 40
    assert high.reason.endswith("held at pool.max 40")


def test_idle_pool_and_fixed_sizes_use_min() -> None:
    idle = compute_target(5.0, 1.0, 10.0, SETTINGS)
    assert (idle.size, idle.reason) == (2, "idle 10 s >= pool.idle_ttl 10 s: pool.min")
    fixed = compute_target(5.0, 1.0, 0.1, replace(SETTINGS, adaptive=False))
    assert (fixed.size, fixed.reason) == (2, "fixed: pool.adaptive is off")
    assert compute_target(0.0, 1.0, None, SETTINGS).reason == "no request yet: pool.min"


def test_lead_time_follows_measured_bulk_creates() -> None:
    sizer: PoolSizer[str] = PoolSizer(SETTINGS)
    sizer.bulk_created(3.0)
    assert sizer.lead == 3.0  # the first measurement replaces the prior
    sizer.bulk_created(1.0)
    assert abs(sizer.lead - 2.4) < 1e-9


def test_surplus_only_after_the_ttl() -> None:
    sizer: PoolSizer[str] = PoolSizer(SETTINGS)
    sizer.bulk_created(1.0)
    for i in range(20):
        sizer.request("p", i * 0.05)
    assert sizer.target("p", 1.0).size > SETTINGS.min
    assert sizer.surplus("p", 30, 5.0) == 0  # quiet, but not for a TTL yet
    assert sizer.surplus("p", 30, 0.95 + 10.0) == 28  # back to min
    assert sizer.surplus("never-requested", 9, 0.0) == 0  # its clock starts now
    assert sizer.surplus("never-requested", 9, 10.0) == 7
    assert PoolSizer(replace(SETTINGS, adaptive=False)).surplus("p", 30, 1e6) == 0


settings_st = st.builds(
    lambda lo, span, headroom, ttl: PoolSettings(
        min=lo, max=lo + span if span >= 0 else 0, headroom=headroom, idle_ttl=ttl
    ),
    st.integers(0, 50),
    st.integers(-1, 100),
    st.floats(1.0, 10.0),
    st.floats(0.1, 1000.0),
)


@given(
    settings_st,
    st.floats(0.0, 1e4, allow_nan=False),
    st.floats(0.0, 600.0, allow_nan=False),
    st.one_of(st.none(), st.floats(0.0, 1e5, allow_nan=False)),
)
def test_target_never_leaves_min_and_max(
    settings: PoolSettings, rate: float, lead: float, idle_for: float | None
) -> None:
    for adaptive in (True, False):
        target = compute_target(rate, lead, idle_for, replace(settings, adaptive=adaptive))
        assert settings.min <= target.size
        assert not settings.max or target.size <= settings.max
        assert target.reason


@given(
    settings_st,
    st.lists(st.floats(0.0, 100.0, allow_nan=False), max_size=60),
    st.floats(0.0, 2000.0, allow_nan=False),
    st.integers(0, 500),
)
def test_sizer_stays_in_bounds_and_never_deletes_below_min(
    settings: PoolSettings, gaps: list[float], later: float, size: int
) -> None:
    sizer: PoolSizer[str] = PoolSizer(settings)
    now = 0.0
    for gap in gaps:
        now += gap
        sizer.request("p", now)
        target = sizer.target("p", now).size
        assert settings.min <= target and (not settings.max or target <= settings.max)
    surplus = sizer.surplus("p", size, now + later)
    assert 0 <= surplus <= max(size - settings.min, 0)


def test_status_shows_each_pools_target_and_why() -> None:
    from podwire.status.render import _pool_lines
    from podwire.status.report import Report

    target = compute_target(5.0, 1.5, 0.5, SETTINGS)
    pool = {
        "key": {"node": "node-1", "project_id": "p" * 32, "network_id": "n" * 36},
        "size": 12,
        "in_use": 3,
        "recyclable": 0,
        "last_refill": None,
        "sizing": target.to_json(),
    }
    text = "\n".join(_pool_lines(Report(pools={"state": "ok", "pools": [pool]})))
    assert "free target in-use" in text
    assert "node-1" in text and "    15 " in text
    assert "target: drain 5.00/s x refill 1.50 s x headroom 2 = 15" in text


def test_a_refill_grows_the_pool_by_doubling_toward_the_target() -> None:
    from podwire.controller.sizing import step_toward

    assert step_toward(200, 0, 10) == 10  # a spike of 50 requests does not order 200 ports
    assert step_toward(200, 10, 10) == 30
    assert step_toward(200, 30, 10) == 70
    assert step_toward(12, 30, 10) == 12  # at or below the pool: the target itself


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 100))
def test_a_refill_step_never_passes_the_target(target: int, size: int, batch: int) -> None:
    from podwire.controller.sizing import step_toward

    step = step_toward(target, size, batch)
    assert step <= target
    assert step >= min(target, size)  # never asks to shrink below what is there


def test_a_short_burst_never_asks_for_more_than_its_peak() -> None:
    settings = replace(SETTINGS, max=0)
    sizer: PoolSizer[str] = PoolSizer(settings)
    sizer.bulk_created(20.0)  # a slow Neutron: rate x refill time would be 600
    for i in range(30):  # 30 pods in 1.5 s
        sizer.request("p", i * 0.05)
    target = sizer.target("p", 1.5)
    assert target.size == 30, target  # a repeat of the 30 out at once
    assert "most ports out at once" in target.reason


def test_the_peak_counts_ports_in_use_so_a_repeated_burst_asks_for_no_more() -> None:
    settings = replace(SETTINGS, max=0)
    deleted: PoolSizer[str] = PoolSizer(settings)  # each burst's pods deleted before the next
    staying: PoolSizer[str] = PoolSizer(settings)  # the pods stay
    for sizer in (deleted, staying):
        sizer.bulk_created(20.0)
    for burst in range(3):
        start = burst * 5.0
        for i in range(30):
            deleted.request("p", start + i * 0.05)
            staying.request("p", start + i * 0.05)
        for i in range(30):  # released: deleted or recycled, either way no longer in use
            deleted.released("p", start + 2.0 + i * 0.01)
    assert deleted.target("p", 12.0).size == 30
    assert staying.target("p", 12.0).size == 90  # 90 pods on the node at once


def test_a_burst_within_two_windows_is_not_a_sustained_drain() -> None:
    sizer: PoolSizer[str] = PoolSizer(SETTINGS)
    sizer.bulk_created(2.0)
    for i in range(30):  # 30 requests over 1.5 windows
        sizer.request("p", i * 0.05)
    assert sizer.reserve("p", 1.6) == 0
    steady: PoolSizer[str] = PoolSizer(SETTINGS)
    steady.bulk_created(2.0)
    for i in range(40):  # 5 requests/s for 8 s
        steady.request("p", i * 0.2)
    assert steady.reserve("p", 8.0) >= 6  # ~4/s sustained x 2 s refill
