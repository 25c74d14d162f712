"""The benchmark's targets: worker CPU per delivery against the bare
aiohttp client's per request, slow receivers against the same worker's rate on the same endpoints
answering at once and against the naive design, latency against its floor; the withdrawn throughput
targets printed without a goal. Arithmetic only: no run, no timing."""

import argparse

import pytest

from bench.sections import e2e, latency, slow


def m(values: list[float]) -> dict:
    return {"median": sorted(values)[len(values) // 2], "values": values}


def drained(whole: float, steady: float | None) -> dict:
    return {"cpu_ms_per_delivery": {"workers": whole},
            "cpu_ms_per_delivery_after_first_receipt": None if steady is None else {"workers": steady}}


def test_cpu_over_bare_pairs_each_drain_with_the_bare_run_of_its_round():
    bare = [{"client_cpu_ms_per_request": v} for v in (0.2, 0.1, 0.25)]
    workers = [drained(0.3, 0.24), drained(0.15, 0.13), drained(0.4, 0.3)]
    cpu = e2e.cpu_over_bare(bare, workers)
    # pair by pair: 0.24/0.2, 0.13/0.1, 0.3/0.25 (not the ratio of the medians, 0.24/0.2)
    assert cpu["steady"]["values"] == [1.2, 1.3, 1.2] and cpu["steady"]["median"] == 1.2
    assert cpu["whole_drain"]["values"] == [1.5, 1.5, 1.6]
    assert cpu["worker_cpu_ms_per_delivery_steady"]["median"] == 0.24
    # a drain too short to have a steady figure leaves none, not a median of two
    cpu = e2e.cpu_over_bare(bare, [drained(0.3, 0.24), drained(0.15, None), drained(0.4, 0.3)])
    assert cpu["steady"] is None and cpu["whole_drain"]["median"] == 1.5


def e2e_results(steady: list[float]) -> dict:
    cpu = {"steady": m(steady), "worker_cpu_ms_per_delivery_steady": m([0.3] * 3),
           "whole_drain": m([x + 0.1 for x in steady]), "bare_cpu_ms_per_request": m([0.23] * 3)}
    return {
        "e2e": {"workers_1_cpu_over_bare": cpu, "uvloop_cpu_over_bare": cpu,
                "workers_1_over_bare": m([0.5, 0.6, 0.4]), "bare_ceiling": {"per_second": m([8000.0] * 3)},
                "workers_1_per_second": m([3000.0, 3500.0, 3200.0]),
                "uvloop_over_asyncio": m([0.9, 1.2, 1.3]),
                "workers_2": {"per_second": 4000.0}},
        "naive": {"per_second_first_to_last_receipt": 1500.0},
    }


def rows_by_name(rows: list[dict]) -> dict[str, dict]:
    return {row["target"]: row for row in rows}


@pytest.mark.parametrize(("steady", "result"), [([1.3, 1.25, 1.1], "PASS"), ([1.2, 1.26, 1.4], "MISS")])
def test_worker_cpu_per_delivery_is_at_most_1_25_times_the_bare_clients_on_asyncio(steady, result):
    rows = rows_by_name(e2e.targets(e2e_results(steady), argparse.Namespace(claim_batch_size=None)))
    row = rows["e2e 1 worker on asyncio: CPU per delivery vs bare aiohttp client's per request"
                " (alternating pairs)"]
    assert row["result"] == result and row["goal"] == "<= 1.25x"
    assert all(f"{v:.2f}x" in row["figure"] for v in steady)  # the three values printed
    # uvloop: its CPU per delivery printed beside it, no adoption target of any kind
    uvloop = rows["e2e 1 worker on uvloop: CPU per delivery vs bare aiohttp client's per request"
                  " (alternating pairs)"]
    assert uvloop["result"] == "n/a"


def test_the_withdrawn_throughput_targets_are_printed_without_a_goal():
    rows = rows_by_name(e2e.targets(e2e_results([1.1, 1.1, 1.1]), argparse.Namespace(claim_batch_size=None)))
    for name in ("e2e 1 worker vs bare aiohttp ceiling, throughput (alternating pairs)",
                 "e2e 1 worker: uvloop vs asyncio, throughput (alternating pairs)",
                 "e2e 1 worker vs naive on fast receivers (own table and index)"):
        assert rows[name]["result"] == "n/a" and rows[name]["goal"] == "(no target)", name
    withdrawn = (">= 85%", ">= 5x", ">= 110% to adopt uvloop under `auto`")
    assert not any(r["goal"] in withdrawn for r in rows.values())


def test_the_slow_bound_is_the_lower_of_littles_law_and_the_same_endpoints_answering_at_once():
    # 1,000 in flight at 250 ms: 4,000/s by Little's law; the worker did 2,500/s answered at once
    assert slow.bound(1000, 0.25, 2500.0)["bound_per_second"] == 2500.0
    # 5,000 in flight at 50 ms: 100,000/s by Little's law, so the fast rate bounds
    assert slow.bound(5000, 0.05, 3000.0)["bound_per_second"] == 3000.0
    # 100 in flight at 250 ms: 400/s, below a fast rate of 3,000/s
    assert slow.bound(100, 0.25, 3000.0) == {"littles_law_per_second": 400.0, "fast_per_second": 3000.0,
                                             "bound_per_second": 400.0}


def slow_results(shares: list[float], over_naive: list[float]) -> dict:
    conc = {"share_of_bound": m(shares), "per_second": m([2000.0] * 3), "fast_per_second": m([2200.0] * 3),
            "littles_law_per_second": 4000.0}
    return {"slow": {"concurrency_1000": conc, "concurrency_5000": conc, "over_naive": m(over_naive),
                     "naive": {"per_second": m([38.0] * 3), "ceiling_per_second": 40.0}}}


@pytest.mark.parametrize(("shares", "ratios", "result"),
                         [([0.95, 0.9, 0.7], [30.0, 25.0, 10.0], "PASS"),
                          ([0.95, 0.89, 0.7], [30.0, 24.9, 10.0], "MISS")])
def test_slow_receivers_reach_90_percent_of_the_bound_and_25_times_the_naive_design(shares, ratios, result):
    rows = list(slow.targets(slow_results(shares, ratios), argparse.Namespace()))
    assert [r["goal"] for r in rows] == [">= 90%", ">= 90%", ">= 25x"]
    assert {r["result"] for r in rows} == {result}
    assert all(f"{100 * v:.0f}%" in rows[0]["figure"] for v in shares)
    assert all(f"{v:.1f}x" in rows[2]["figure"] for v in ratios)


def test_over_naive_pairs_each_round():
    worker = [{"per_second": 1000.0}, {"per_second": 760.0}, {"per_second": 1200.0}]
    naive = [{"per_second_first_to_last_receipt": 40.0}, {"per_second_first_to_last_receipt": 38.0},
             {"per_second_first_to_last_receipt": 30.0}]
    assert slow.over_naive(worker, naive) == {"median": 25.0, "values": [25.0, 20.0, 40.0]}


@pytest.mark.parametrize(("p99", "result"), [([2.0, 3.0, 5.0], "PASS"), ([2.0, 3.1, 5.0], "MISS")])
def test_latency_p99_is_at_most_3_times_the_floor_and_p50_1_5_times(p99, result):
    lat = {"p50_over_floor": m([1.4, 1.5, 1.6]), "p99_over_floor": m(p99), "p50_ms": 3.0, "p99_ms": 9.0,
           "floor_p50_ms": 2.0, "floor_p99_ms": 3.0}
    rows = rows_by_name(latency.targets({"latency": lat}, argparse.Namespace()))
    p99_row = rows["latency p99 vs the bare floor (INSERT, LISTEN, POST; alternating)"]
    assert p99_row["goal"] == "<= 3.0x" and p99_row["result"] == result
    p50_row = rows["latency p50 vs the bare floor (INSERT, LISTEN, POST; alternating)"]
    assert p50_row["goal"] == "<= 1.5x" and p50_row["result"] == "PASS"
