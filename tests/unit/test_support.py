"""The shared helper library: the benchmark's workers are the tests' workers, with production timings."""

from __future__ import annotations

from bench.common import WorkerSettings
from tests.support import LOOPBACK, TEST_TIMINGS, worker_config


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
