"""The benchmark harness runs end to end in its quick mode and reports every section.

Checks shape only, never a timing: figures on a shared CI machine mean nothing.
"""

import importlib.util
import json
import subprocess
import sys

import pytest

from bench.common import SERVER_PROCESS_KINDS
from tests.support import ROOT

SECTIONS = ("http", "db", "e2e", "latency", "backlog", "producer", "many", "naive", "endpoint", "slow",
            "features", "api")
# A hang guard, not a speed: the quick run does timed work, which a loaded machine stretches.
QUICK_RUN_HANG_SECONDS = 1200
# The feature-price ladder's steps in order, each the one before plus one feature, then the product.
LADDER = ("features-free", "audit row", "fencing", "health row", "rate limit", "concurrency cap", "circuit",
          "full acquire()+finish()")


@pytest.mark.timeout(QUICK_RUN_HANG_SECONDS + 60)
def test_quick_run_reports_every_section(tmp_path):
    out = tmp_path / "results"
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=QUICK_RUN_HANG_SECONDS, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["errors"] == {}
    for section in SECTIONS:
        assert isinstance(data[section], dict), section
    assert data["e2e"]["workers_1"]["complete"] and data["e2e"]["workers_2"]["complete"]
    assert data["backlog"]["complete"]
    # VACUUM's own words on the purged table are kept, one list per VACUUM run
    assert 1 <= len(data["backlog"]["vacuum_reports"]) <= 3
    assert any("removable cutoff" in line for line in data["backlog"]["vacuum_reports"][0])
    assert data["latency"]["received"] == data["latency"]["inserted"]
    # PostgreSQL's CPU over a drain, split by kind of server process, adds up to the figure the
    # targets use (each part rounded to 0.01 s)
    drained = data["e2e"]["workers_1"]
    by_process = drained["postgres_cpu_seconds_by_process"]
    assert by_process["backends"] > 0
    assert set(by_process) <= {"backends", "not attributed", *SERVER_PROCESS_KINDS}
    assert abs(sum(by_process.values()) - drained["cpu_seconds"]["postgres"]) <= 0.02 * len(by_process)
    assert {t["result"] for t in data["targets"]} <= {"PASS", "MISS", "n/a"}
    # timed ratios are medians of three alternating runs, printed with the three values;
    # the HTTP ceiling is a bare aiohttp session's, the Sender printed beside it
    for ratio in (data["e2e"]["workers_1_over_bare"], data["e2e"]["workers_1_cpu_over_bare"]["whole_drain"],
                  data["http"]["sender_over_bare"], data["db"]["features_cost_ratio"]):
        assert len(ratio["values"]) == 3 and sorted(ratio["values"])[1] == ratio["median"]
    assert len(data["e2e"]["workers_1_runs"]) == len(data["e2e"]["bare_ceiling"]["runs"]) == 3
    assert all(run["complete"] for run in data["e2e"]["workers_1_runs"])
    assert data["http"]["bare"]["runs"][0]["requests"] > 0
    if importlib.util.find_spec("uvloop"):
        assert len(data["e2e"]["uvloop_over_asyncio"]["values"]) == 3
    # the naive baseline is the seed design on its own table, its claim served by its index
    assert "webhook_deliveries_waiting" in data["naive"]["claim_plan"]
    assert data["naive"]["final_status"] == {"delivered": data["naive"]["processed"]}
    assert data["machine"]["load_average"]
    # the latency floor beside the worker, five alternating rounds each, every row received
    assert len(data["latency"]["p50_over_floor"]["values"]) == 5
    assert all(r["received"] == r["inserted"] for r in data["latency"]["rounds"]["floor"])
    # slow receivers: three rounds, each drain complete, each with its bound (the same endpoints
    # answering at once) and the worker's memory; the naive design beside them in each round
    for conc in (1000, 5000):
        slow = data["slow"][f"concurrency_{conc}"]
        assert slow["complete"] and slow["worker_peak_rss_mb"] > 0 and len(slow["runs"]) == 3
        assert all(r["fast"]["complete"] and r["bound_per_second"] > 0 for r in slow["runs"])
        assert len(slow["share_of_bound"]["values"]) == 3
    assert len(data["slow"]["naive"]["runs"]) == len(data["slow"]["over_naive"]["values"]) == 3
    assert all(data["endpoint"][f"max_in_flight_{cap}"]["complete"] for cap in (10, 100, 1000))
    assert len(data["targets"]) >= 10
    # publishing over HTTP beside the direct insert: three alternating rounds each, every answer 202,
    # and the relay counted the API's round trips
    for side in ("single", "batch"):
        assert len(data["api"][side]["api_cpu_ms_per_message"]["values"]) == 3
        assert data["api"][side]["failures"] == [{}, {}, {}]
        assert data["api"]["round_trips"][side]["round_trips"] > 0
    assert len(data["api"]["sql"]["postgres_cpu_ms_per_message"]["values"]) == 3
    assert_feature_prices(data["features"])
    for line in ("HTTP ceiling", "database ceiling", "end to end", "latency", "backlog", "producer",
                 "many endpoints", "naive baseline", "feature prices", "JSON:"):
        assert line in result.stdout, line


def assert_feature_prices(features):
    """The table of what each feature and each index costs: every step drained its whole
    backlog three times and left the state its feature writes; every secondary index was priced or
    reported as one the claim cannot do without."""
    rows = features["rows"]
    assert [step["step"] for step in features["ladder"]] == list(LADDER)
    for index, step in enumerate(features["ladder"]):
        name = step["step"]
        assert len(step["pg_cpu_us_per_delivery"]["values"]) == 3, name
        assert (step["price_us"] is None) == (index == 0), name
        for run in step["runs"]:
            assert run["final_status"] == {"delivered": rows}, name
            assert run["audit_rows"] == (0 if name == "features-free" else rows), name
            writes_health = index >= LADDER.index("health row")
            assert run["health_successes"] == (rows if writes_health else 0), name
            assert (run["rate_buckets_debited"] == 1) == (index >= LADDER.index("rate limit")), name
            assert (run["circuit_window_attempts"] > 0) == (index >= LADDER.index("circuit")), name
    indexes = features["indexes"]
    names = {entry["index"] for entry in indexes["dropped"]}
    # the queue's and the audit log's secondary indexes, not their primary keys
    assert {"alert_delivery_queue_claimable", "alert_delivery_queue_leased",
            "alert_delivery_log_delivery"} <= names
    assert not any(name.endswith("_pkey") for name in names)
    assert all(run["complete"] and run["final_status"] == {"delivered": run["rows"]}
               for run in indexes["all"]["runs"])
    for entry in indexes["dropped"]:
        if entry.get("pathological"):
            assert not entry["pathological"]["complete"] and entry["price_us"] is None, entry["index"]
        else:
            assert len(entry["pg_cpu_us_per_delivery"]["values"]) == 3, entry["index"]
            assert all(run["final_status"] == {"delivered": run["rows"]} for run in entry["runs"])


@pytest.mark.timeout(QUICK_RUN_HANG_SECONDS + 60)
def test_quick_restart_and_messages_sections_report(tmp_path):
    # Not in the default run: a drain through a crash of the cluster, and the message history's pages.
    out = tmp_path / "results"
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--only", "restart,messages", "--out", str(out)],
        capture_output=True, text=True, timeout=QUICK_RUN_HANG_SECONDS, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["errors"] == {}
    restart = data["restart"]
    assert restart["complete"] and restart["crash_at_seconds"] > 0 and restart["per_second_before"] > 0
    assert set(restart["state_after_drain"]) == {"webhook_health_metrics", "alert_delivery_queue"}
    pages = data["messages"]["ms"]
    assert set(pages) == {"messages, first page", "messages, a page half way back",
                          "messages, first page of one event type", "deliveries, first page"}
    assert all(len(page["values"]) == 2 for page in pages.values())
    assert {t["target"].split(":")[0] for t in data["targets"]} >= {
        "restart -m immediate mid-drain", "GET /v1/messages, a page of 100 with 3,000 stored"}
