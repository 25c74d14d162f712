"""The shared helper library: the benchmark's workers are the tests' workers, with production timings;
waits fail on hangs, not on a slow machine."""

from __future__ import annotations

import pytest

from bench.common import WorkerSettings
from tests.support import LOOPBACK, TEST_TIMINGS, eventually, worker_config


def test_tests_shorten_polls_and_the_benchmark_keeps_production_timings() -> None:
    dsn = "postgresql://u@127.0.0.1/db"
    tests = worker_config(dsn, "w", as_role=False)
    bench = worker_config(dsn, "w", as_role=False, timings={}, **WorkerSettings(concurrency=7).sections())
    assert tests["worker"]["poll_interval_seconds"] == TEST_TIMINGS["worker"]["poll_interval_seconds"]
    assert "poll_interval_seconds" not in bench["worker"]
    assert "stats_interval_seconds" not in bench["http"]
    assert bench["worker"] == {"id": "w", "concurrency": 7}
    assert bench["security"]["allow_networks"] == LOOPBACK == tests["security"]["allow_networks"]


def test_bench_settings_map_to_config_sections() -> None:
    settings = WorkerSettings(concurrency=300, claim_batch_size=50, finish_batch_size=20, pool_max_size=6)
    assert settings.sections() == {
        "worker": {"concurrency": 300},
        "delivery": {"claim_batch_size": 50, "finish_batch_size": 20},
        "database": {"pool_max_size": 6},
    }
    assert WorkerSettings().sections() == {}


class FakeClock:
    """Time that passes only when the helper sleeps: the waits below take no real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def wait(check, clock, **options):
    return eventually(check, interval=1.0, clock=clock, sleep=clock.sleep, **options)


def test_eventually_returns_the_first_truthy_value_without_waiting_longer():
    clock = FakeClock()
    answers = iter([0, None, "", "ready", "later"])
    assert wait(lambda: next(answers), clock, timeout=10) == "ready"
    assert clock.now == 3.0


def test_without_progress_only_the_timeout_fails_it():
    clock = FakeClock()
    with pytest.raises(AssertionError, match=r"the thing not met within 5 s \(last value: False\)"):
        wait(lambda: False, clock, timeout=5, message="the thing")
    assert 5.0 < clock.now <= 6.0


def test_a_wait_that_keeps_moving_outlasts_its_stall_and_succeeds():
    # 100 s of work, moving every 2 s, never still for the 5 s stall: no deadline on speed
    clock = FakeClock()
    assert wait(lambda: clock.now >= 100, clock, progress=lambda: clock.now // 2, stall=5, timeout=1000)
    assert clock.now == 100.0


def test_a_wait_on_which_nothing_moves_fails_after_the_stall_not_the_cap():
    clock = FakeClock()
    with pytest.raises(AssertionError, match=r"rows final not met: nothing moved for 5 s \(progress: 7"):
        wait(lambda: False, clock, progress=lambda: 7, stall=5, timeout=1000, message="rows final")
    assert 5.0 < clock.now <= 6.0


def test_a_stall_counts_from_the_last_move():
    # moves until 20 s, then stands still: fails 5 s after the last move, not 5 s after the start
    clock = FakeClock()
    with pytest.raises(AssertionError, match="nothing moved for 5 s"):
        wait(lambda: False, clock, progress=lambda: min(clock.now, 20.0), stall=5, timeout=1000)
    assert 25.0 < clock.now <= 26.0


def test_the_cap_still_stops_a_wait_that_moves_but_never_ends():
    clock = FakeClock()
    with pytest.raises(AssertionError, match=r"not met within 30 s \(last value: False, progress: 31.0\)"):
        wait(lambda: False, clock, progress=lambda: clock.now, stall=5, timeout=30)
    assert 30.0 < clock.now <= 31.0
