"""Section `features`: what each feature and each index costs per delivery in PostgreSQL CPU.

A ladder of modelled claims and finishes, the product's acquire()+finish(), and the product's drain
with each secondary index dropped in turn. The ladder is a *model*: plain SQL statements the harness
sends, written in the spirit of what webhooks.acquire() and webhooks.finish() do for each feature,
not the product's code path. It starts from a features-free claim/finish and adds one feature per
step, so the difference between two steps is the price of the feature the later one adds. The
product's own path is the last row, `full`: Queue.acquire() + Queue.finish() exactly as the `db`
section drains them; its difference to the last modelled step is what the model leaves out (see
bench/README.md, section `features`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.common import (
    BENCH_KEYRING,
    GENEROUS_LIMITS,
    machine_load,
    median_of,
    preload,
    register_endpoints,
)
from bench.localworker import query, worker_dsn
from bench.section import Context, Figures, Section

# Each figure is the median of this many runs, taken in rounds through every variant (A B C … A B C …).
ROUNDS = 3
LEASE_SECONDS = 60
# A drain without one index that takes this many times as long as with all of them (and at least
# this long) is stopped: that index is what keeps the claim usable, and it is reported, not priced.
PATHOLOGICAL_FACTOR = 5
PATHOLOGICAL_MIN_SECONDS = 10.0


def _with(sql: str, old: str, new: str) -> str:
    """`sql` with `old` replaced by `new`; a step that silently added nothing would price nothing."""
    if sql.count(old) != 1:
        raise ValueError(f"ladder: expected one {old.strip()[:60]!r} in the statement")
    return sql.replace(old, new)


# --- the product's path ----------------------------------------------------------------------------


async def acquire_finish_drain(dsn: str, rows: int, batch: int,
                               seconds_limit: float | None = None) -> dict[str, Any]:
    """Queue.acquire() then Queue.finish() (as delivered, 200) over `rows` rows, one connection, no
    HTTP: the product's SQL cost of a delivery. Stops early (complete=False) past seconds_limit."""
    from worker.rules.model import Finished
    from worker.store.queue import Queue

    queue = Queue.create(worker_dsn(dsn), 1, 2, 10.0, "bench-db", BENCH_KEYRING)
    await queue.open()
    await queue.pool.wait()
    done, claims, finishes = 0, 0, 0
    started = time.monotonic()
    while done < rows:
        if seconds_limit is not None and time.monotonic() - started > seconds_limit:
            break
        claimed = await queue.acquire("bench-db", batch, LEASE_SECONDS)
        claims += 1
        if not claimed:
            break
        await queue.finish(
            "bench-db",
            [
                Finished(
                    delivery_id=r.delivery_id,
                    lease_token=r.lease_token,
                    attempt=r.attempt,
                    outcome="delivered",
                    http_status=200,
                    latency_ms=1,
                    response_excerpt="ok",
                )
                for r in claimed
            ],
        )
        finishes += 1
        done += len(claimed)
    elapsed = time.monotonic() - started
    await queue.close()
    return {
        "rows": done,
        "complete": done >= rows,
        "seconds": round(elapsed, 2),
        "per_second": round(done / elapsed, 1),
        "acquire_calls": claims,
        "finish_calls": finishes,
    }


# --- the ladder: modelled claims and finishes ------------------------------------------------------

# A features-free claim and finish on the same table shape: the oldest due rows leased
# and returned with their payload (their message's, by primary key, as acquire() reads it),
# then marked delivered with an audit row. No rate limit,
# concurrency cap, circuit, fencing, health row, ordering or settings. (The `db` section's
# features-free side, and the ladder's step `audit row`.)
BARE_CLAIM = (
    "UPDATE webhooks.alert_delivery_queue SET status = 'delivering', lease_token = gen_random_uuid(),"
    " locked_until = now() + interval '60 seconds', locked_by = 'bench-bare', attempts = attempts + 1,"
    " updated_at = now()"
    " WHERE delivery_id = ANY (ARRAY(SELECT delivery_id FROM webhooks.alert_delivery_queue"
    "   WHERE status IN ('pending', 'retrying') AND next_retry_at <= now()"
    "   ORDER BY webhook_id, priority DESC, next_retry_at, delivery_id LIMIT %s FOR UPDATE SKIP LOCKED))"
    " RETURNING delivery_id, (SELECT m.payload::text FROM webhooks.messages m"
    "   WHERE m.message_id = alert_delivery_queue.message_id)"
)
BARE_FINISH = (
    "WITH done AS (UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now(),"
    "   lease_token = NULL, locked_until = NULL, locked_by = NULL, last_http_status = 200,"
    "   updated_at = now() WHERE delivery_id = ANY (%s) RETURNING delivery_id, webhook_id, attempts)"
    " INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, http_status,"
    "   latency_ms, worker_id) SELECT delivery_id, webhook_id, attempts, 'delivered', 200, 1, 'bench-bare'"
    " FROM done"
)
# BARE_FINISH's UPDATE alone: the ladder's first step writes no audit row.
BARE_FINISH_NO_AUDIT = (
    "UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now(),"
    " lease_token = NULL, locked_until = NULL, locked_by = NULL, last_http_status = 200,"
    " updated_at = now() WHERE delivery_id = ANY (%s)"
)

# Fencing: the claim hands out each row's lease token; the finish changes a row only under the same
# token, and still logs an outcome whose lease was taken over, marked stale (as finish() does).
FENCED_CLAIM = _with(BARE_CLAIM, " RETURNING delivery_id, (SELECT",
                     " RETURNING delivery_id, lease_token, (SELECT")
_FENCED_FINISH_HEAD = """
WITH o AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS o(delivery_id, lease_token)
), target AS (
    SELECT o.delivery_id, o.lease_token, q.webhook_id, q.attempts
    FROM o JOIN webhooks.alert_delivery_queue q ON q.delivery_id = o.delivery_id
), done AS (
    UPDATE webhooks.alert_delivery_queue q
    SET status = 'delivered', delivered_at = now(), lease_token = NULL, locked_until = NULL,
        locked_by = NULL, last_http_status = 200, updated_at = now()
    FROM target t
    WHERE q.delivery_id = ANY (ARRAY(SELECT t2.delivery_id FROM target t2))
      AND q.delivery_id = t.delivery_id AND q.lease_token = t.lease_token
    RETURNING q.delivery_id
), logged AS (
    INSERT INTO webhooks.alert_delivery_log
        (delivery_id, webhook_id, attempt, outcome, http_status, latency_ms, worker_id, lease_token, stale)
    SELECT t.delivery_id, t.webhook_id, t.attempts, 'delivered', 200, 1, 'bench-features', t.lease_token,
           d.delivery_id IS NULL
    FROM target t LEFT JOIN done d ON d.delivery_id = t.delivery_id
    RETURNING 1
)"""
FENCED_FINISH = _FENCED_FINISH_HEAD + "\nSELECT count(*) FROM logged"

# Health row: the finish adds each endpoint's outcomes to its counters, once per endpoint per batch.
HEALTH_FINISH = _FENCED_FINISH_HEAD + """, per_endpoint AS (
    SELECT t.webhook_id, count(*)::integer AS attempts, count(*)::integer AS successes,
           count(*)::bigint AS latency_ms
    FROM target t GROUP BY t.webhook_id
)
UPDATE webhooks.webhook_health_metrics h
SET total_attempts = h.total_attempts + p.attempts, successes = h.successes + p.successes,
    failures = h.failures + p.attempts - p.successes, total_latency_ms = h.total_latency_ms + p.latency_ms,
    consecutive_failures = 0, last_success_at = now(), last_http_status = 200, failing_since = NULL,
    health_status = CASE WHEN e.active THEN 'healthy' ELSE 'disabled' END, updated_at = now()
FROM per_endpoint p JOIN webhooks.endpoints e ON e.id = p.webhook_id
WHERE h.webhook_id = p.webhook_id"""

# Rate limit: the claim locks the state rows of the endpoints with due rows (SKIP LOCKED: what makes
# a limit hold across the fleet without a claim ever waiting), refills each token bucket to now,
# takes at most floor(tokens) rows per endpoint and debits them. The endpoint lock replaces the row
# locks of the features-free claim, as in acquire().
RATE_CLAIM = """
WITH clock AS (
    SELECT clock_timestamp() AS now_exact
), endpoint AS (
    SELECT h.webhook_id, h.rate_tokens, h.rate_refilled_at,
           coalesce(e.rate_limit_per_second, c.rate_limit_per_second)::double precision AS rate,
           coalesce(e.rate_limit_burst, c.rate_limit_burst,
                    greatest(1, ceil(coalesce(e.rate_limit_per_second, c.rate_limit_per_second))))
               ::double precision AS burst
    FROM webhooks.webhook_health_metrics h
    JOIN webhooks.endpoints e ON e.id = h.webhook_id
    CROSS JOIN webhooks.delivery_config c
    WHERE e.active
      AND EXISTS (SELECT 1 FROM webhooks.alert_delivery_queue q
                  WHERE q.webhook_id = h.webhook_id AND q.status IN ('pending', 'retrying')
                    AND q.next_retry_at <= now())
    ORDER BY h.webhook_id
    LIMIT %(batch)s
    FOR UPDATE OF h SKIP LOCKED
), tokens AS (
    SELECT ep.*,
           CASE WHEN ep.rate IS NOT NULL THEN least(ep.burst, coalesce(ep.rate_tokens, ep.burst)
               + ep.rate * greatest(0, extract(epoch FROM clock.now_exact
                                                   - coalesce(ep.rate_refilled_at, clock.now_exact))))
           END AS tokens_now
    FROM endpoint ep CROSS JOIN clock
), quota AS (
    SELECT t.*, least(%(batch)s, CASE WHEN t.rate IS NULL THEN %(batch)s
                                      ELSE floor(t.tokens_now)::integer END) AS quota
    FROM tokens t
), picked AS (
    SELECT r.delivery_id
    FROM quota qt
    CROSS JOIN LATERAL (
        SELECT q.delivery_id, q.priority, q.next_retry_at
        FROM webhooks.alert_delivery_queue q
        WHERE q.webhook_id = qt.webhook_id AND q.status IN ('pending', 'retrying')
          AND q.next_retry_at <= now()
        ORDER BY q.priority DESC, q.next_retry_at, q.delivery_id
        LIMIT greatest(qt.quota, 0)
    ) r
    ORDER BY r.priority DESC, r.next_retry_at, r.delivery_id
    LIMIT %(batch)s
), claimed AS (
    UPDATE webhooks.alert_delivery_queue q
    SET status = 'delivering', attempts = q.attempts + 1, locked_by = 'bench-features',
        lease_token = gen_random_uuid(), locked_until = now() + interval '60 seconds', updated_at = now()
    WHERE q.delivery_id = ANY (ARRAY(SELECT p.delivery_id FROM picked p))
      AND q.status IN ('pending', 'retrying')
    RETURNING q.delivery_id, q.webhook_id, q.lease_token, q.message_id
), debited AS (
    UPDATE webhooks.webhook_health_metrics h
    SET rate_tokens = CASE WHEN qt.rate IS NOT NULL THEN qt.tokens_now - n.claimed END,
        rate_refilled_at = CASE WHEN qt.rate IS NOT NULL THEN clock.now_exact END,
        updated_at = now()
    FROM (SELECT c.webhook_id, count(*)::integer AS claimed FROM claimed c GROUP BY c.webhook_id) n
    JOIN quota qt ON qt.webhook_id = n.webhook_id
    CROSS JOIN clock
    WHERE h.webhook_id = n.webhook_id
    RETURNING 1
)
SELECT c.delivery_id, c.lease_token, m.payload::text
FROM claimed c JOIN webhooks.messages m ON m.message_id = c.message_id"""

# Concurrency cap: as the rate limit, and each endpoint's quota is also bounded by its free places
# (max_in_flight minus its rows in flight, counted on the `leased` index).
CAP_CLAIM = _with(_with(
    RATE_CLAIM,
    """
), quota AS (
    SELECT t.*, least(%(batch)s, CASE WHEN t.rate IS NULL THEN %(batch)s
                                      ELSE floor(t.tokens_now)::integer END) AS quota
    FROM tokens t
)""",
    """
), in_flight AS (
    SELECT t.*, f.flying
    FROM tokens t
    CROSS JOIN LATERAL (
        SELECT count(*)::integer AS flying FROM webhooks.alert_delivery_queue d
        WHERE d.webhook_id = t.webhook_id AND d.status = 'delivering' AND d.locked_until > now()
    ) f
), quota AS (
    SELECT t.*, least(%(batch)s, t.max_in_flight - t.flying,
                      CASE WHEN t.rate IS NULL THEN %(batch)s ELSE floor(t.tokens_now)::integer END) AS quota
    FROM in_flight t
)"""),
    "               ::double precision AS burst\n",
    "               ::double precision AS burst,\n"
    "           coalesce(e.max_in_flight, c.max_in_flight) AS max_in_flight\n")

# Circuit: as the cap, and the claim passes over endpoints paused (Retry-After) or whose circuit is
# open (or forced open); an open circuit whose sleep is over turns half-open, which bounds the quota
# by the probes not yet answered. The finish keeps the circuit's sliding window (two fixed windows
# weighted by overlap) and opens the circuit when the failure ratio is reached.
CIRCUIT_CLAIM = CAP_CLAIM
for _old, _new in (
    ("    WHERE e.active\n",
     "    WHERE e.active\n"
     "      AND (h.paused_until IS NULL OR h.paused_until <= now())\n"
     "      AND h.circuit_state <> 'forced_open'\n"
     "      AND (h.circuit_state <> 'open' OR h.circuit_open_until <= now())\n"),
    ("    SELECT h.webhook_id, h.rate_tokens, h.rate_refilled_at,\n",
     "    SELECT h.webhook_id, h.rate_tokens, h.rate_refilled_at, h.circuit_state,\n"
     "           h.probe_successes + h.probe_failures AS probe_results,\n"
     "           coalesce((e.circuit_policy ->> 'probes')::integer, c.circuit_probes) AS probes,\n"),
    ("                      CASE WHEN t.rate IS NULL THEN %(batch)s ELSE floor(t.tokens_now)::integer END)"
     " AS quota\n",
     "                      CASE WHEN t.rate IS NULL THEN %(batch)s ELSE floor(t.tokens_now)::integer END,\n"
     "                      CASE t.circuit_state WHEN 'open' THEN t.probes\n"
     "                                           WHEN 'half_open'\n"
     "                                               THEN t.probes - t.probe_results - t.flying\n"
     "                                           ELSE %(batch)s END) AS quota\n"),
    ("        rate_refilled_at = CASE WHEN qt.rate IS NOT NULL THEN clock.now_exact END,\n",
     "        rate_refilled_at = CASE WHEN qt.rate IS NOT NULL THEN clock.now_exact END,\n"
     "        circuit_state = CASE WHEN h.circuit_state = 'open' THEN 'half_open' ELSE h.circuit_state END,\n"
     "        probe_successes = CASE WHEN h.circuit_state = 'open' THEN 0 ELSE h.probe_successes END,\n"
     "        probe_failures = CASE WHEN h.circuit_state = 'open' THEN 0 ELSE h.probe_failures END,\n"),
):
    CIRCUIT_CLAIM = _with(CIRCUIT_CLAIM, _old, _new)
CIRCUIT_FINISH = _FENCED_FINISH_HEAD + """, per_endpoint AS (
    SELECT t.webhook_id, count(*)::integer AS attempts, count(*)::integer AS successes,
           0 AS availability_failures, count(*)::bigint AS latency_ms
    FROM target t GROUP BY t.webhook_id
), policy AS (
    SELECT p.*, e.active,
           coalesce((e.circuit_policy ->> 'failure_ratio')::real, c.circuit_failure_ratio) AS failure_ratio,
           coalesce((e.circuit_policy ->> 'window_seconds')::integer, c.circuit_window_seconds)
               AS window_seconds,
           coalesce((e.circuit_policy ->> 'min_attempts')::integer, c.circuit_min_attempts) AS min_attempts,
           coalesce((e.circuit_policy ->> 'sleep_seconds')::integer, c.circuit_sleep_seconds) AS sleep_seconds
    FROM per_endpoint p JOIN webhooks.endpoints e ON e.id = p.webhook_id
    CROSS JOIN webhooks.delivery_config c
), windowed AS (
    SELECT p.*, h.circuit_state, w.*
    FROM policy p
    JOIN webhooks.webhook_health_metrics h ON h.webhook_id = p.webhook_id
    CROSS JOIN LATERAL (SELECT make_interval(secs => p.window_seconds) AS span) s
    CROSS JOIN LATERAL (
        -- the same window, the next one (the current becomes the previous), or a fresh start
        SELECT CASE WHEN h.window_started_at IS NULL OR now() >= h.window_started_at + 2 * s.span THEN 'fresh'
                    WHEN now() >= h.window_started_at + s.span THEN 'next'
                    ELSE 'same' END AS roll
    ) r
    CROSS JOIN LATERAL (
        SELECT CASE r.roll WHEN 'fresh' THEN now() WHEN 'next' THEN h.window_started_at + s.span
                           ELSE h.window_started_at END AS started,
               CASE r.roll WHEN 'fresh' THEN 0 WHEN 'next' THEN h.window_attempts
                           ELSE h.previous_attempts END AS previous_attempts,
               CASE r.roll WHEN 'fresh' THEN 0 WHEN 'next' THEN h.window_failures
                           ELSE h.previous_failures END AS previous_failures,
               CASE r.roll WHEN 'same' THEN h.window_attempts ELSE 0 END + p.attempts AS window_attempts,
               CASE r.roll WHEN 'same' THEN h.window_failures ELSE 0 END + p.availability_failures
                   AS window_failures
    ) w
), decided AS (
    SELECT w.*, w.circuit_state = 'closed' AND x.attempts >= w.min_attempts
                AND x.failures >= w.failure_ratio * x.attempts AS opens
    FROM windowed w
    CROSS JOIN LATERAL (
        SELECT greatest(0, 1 - extract(epoch FROM now() - w.started) / w.window_seconds) AS weight) v
    CROSS JOIN LATERAL (SELECT w.window_attempts + w.previous_attempts * v.weight AS attempts,
                               w.window_failures + w.previous_failures * v.weight AS failures) x
)
UPDATE webhooks.webhook_health_metrics h
SET total_attempts = h.total_attempts + d.attempts, successes = h.successes + d.successes,
    failures = h.failures + d.attempts - d.successes, total_latency_ms = h.total_latency_ms + d.latency_ms,
    consecutive_failures = 0, last_success_at = now(), last_http_status = 200, failing_since = NULL,
    health_status = CASE WHEN d.active THEN 'healthy' ELSE 'disabled' END,
    window_started_at = d.started, window_attempts = d.window_attempts, window_failures = d.window_failures,
    previous_attempts = d.previous_attempts, previous_failures = d.previous_failures,
    probe_successes = CASE WHEN h.circuit_state = 'half_open'
                           THEN h.probe_successes + d.attempts - d.availability_failures
                           ELSE h.probe_successes END,
    circuit_state = CASE WHEN d.opens THEN 'open' ELSE h.circuit_state END,
    circuit_opened_at = CASE WHEN d.opens THEN now() ELSE h.circuit_opened_at END,
    circuit_open_until = CASE WHEN d.opens THEN now() + make_interval(secs => d.sleep_seconds)
                              ELSE h.circuit_open_until END,
    updated_at = now()
FROM decided d
WHERE h.webhook_id = d.webhook_id"""


@dataclass(frozen=True)
class Step:
    """One rung of the ladder: the claim and finish statements the harness sends."""

    name: str
    adds: str
    claim: str  # takes the batch size: %s, or %(batch)s
    finish: str  # takes the claimed ids: %s, or %(ids)s with the lease tokens as %(tokens)s


LADDER = (
    Step("features-free", "claim and finish, no audit row", BARE_CLAIM, BARE_FINISH_NO_AUDIT),
    Step("audit row", "an audit row per attempt (the `db` section's features-free side)", BARE_CLAIM,
         BARE_FINISH),
    Step("fencing", "finish only under the claim's lease token; a stale outcome logged as stale",
         FENCED_CLAIM, FENCED_FINISH),
    Step("health row", "finish adds the outcomes to the endpoint's health counters", FENCED_CLAIM,
         HEALTH_FINISH),
    Step("rate limit", "claim locks the endpoint's state row, refills and debits its token bucket",
         RATE_CLAIM, HEALTH_FINISH),
    Step("concurrency cap", "claim counts the endpoint's rows in flight against max_in_flight",
         CAP_CLAIM, HEALTH_FINISH),
    Step("circuit", "claim reads pause and circuit state (half-open probes); finish keeps the window",
         CIRCUIT_CLAIM, CIRCUIT_FINISH),
)
FULL = "full acquire()+finish()"
FULL_ADDS = ("the product's path: what the model leaves out (lease reaping and expiry, tenants and "
             "fairness, ordering keys, coalescing, per-row settings, the JSON outcomes, PL/pgSQL)")


# --- one run ---------------------------------------------------------------------------------------


def one_endpoint_backlog(ctx: Context, name: str, rows: int,
                         drop_index: str | None = None) -> tuple[str, float]:
    """A fresh database with one endpoint (limits that never bind) and `rows` due rows, analyzed;
    without `drop_index` if given. Returns its DSN and the seconds the rows took to load."""
    dsn = ctx.cluster.new_database(name)
    if drop_index:
        query(dsn, f"DROP INDEX webhooks.{drop_index}")
    [endpoint] = register_endpoints(dsn, [ctx.sink.url()], **GENEROUS_LIMITS)
    preload_seconds = preload(dsn, [endpoint], rows)
    query(dsn, "VACUUM ANALYZE webhooks.alert_delivery_queue")
    return dsn, preload_seconds


def end_state(dsn: str) -> dict[str, Any]:
    """What the drain left behind, to check each step wrote what it claims to."""
    [(logged,)] = query(dsn, "SELECT count(*) FROM webhooks.alert_delivery_log")
    [(successes, debited, windowed)] = query(
        dsn, "SELECT sum(successes), count(rate_refilled_at), sum(window_attempts + previous_attempts)"
             " FROM webhooks.webhook_health_metrics")
    return {
        "final_status": dict(query(dsn, "SELECT status, count(*) FROM webhooks.alert_delivery_queue"
                                        " GROUP BY 1")),
        "audit_rows": logged,
        "health_successes": int(successes or 0),
        "rate_buckets_debited": debited,
        "circuit_window_attempts": int(windowed or 0),
    }


def _figures(rows: int, seconds: float, pg_cpu: float) -> dict[str, Any]:
    return {"rows": rows, "seconds": round(seconds, 2), "per_second": round(rows / max(1e-9, seconds), 1),
            "pg_cpu_us_per_delivery": round(pg_cpu * 1e6 / max(1, rows), 1)}


def model_run(ctx: Context, step: Step, rows: int, batch: int) -> dict[str, Any]:
    """Drain a fresh backlog with one step's statements, one connection, batches of `batch`."""
    name = "bench_features"
    dsn, _ = one_endpoint_backlog(ctx, name, rows)
    done = 0
    claim_named, finish_named = "%(batch)s" in step.claim, "%(ids)s" in step.finish
    with psycopg.connect(dsn, autocommit=True) as conn:
        # as every function of the product (SET jit = off): a statement of many CTEs is estimated
        # costly enough for JIT compilation, which took 200 ms of a 230 ms finish here
        conn.execute("SET jit = off")
        pg0, started = ctx.cluster.cpu(), time.monotonic()
        while done < rows:
            claim_args: Any = {"batch": batch} if claim_named else (batch,)
            claimed = conn.execute(step.claim, claim_args).fetchall()
            if not claimed:
                break
            ids = [r[0] for r in claimed]
            # fenced claims return (id, lease token, payload)
            finish_args: Any = {"ids": ids, "tokens": [r[1] for r in claimed]} if finish_named else (ids,)
            conn.execute(step.finish, finish_args)
            done += len(claimed)
        elapsed, pg_cpu = time.monotonic() - started, ctx.cluster.cpu() - pg0
    out = {**_figures(done, elapsed, pg_cpu), **end_state(dsn)}
    ctx.cluster.drop_database(name)
    return out


def product_run(ctx: Context, rows: int, batch: int, drop_index: str | None = None,
                seconds_limit: float | None = None) -> dict[str, Any]:
    """acquire()+finish() over a fresh backlog, measured as the `db` section measures it."""
    name = "bench_features_full"
    dsn, _ = one_endpoint_backlog(ctx, name, rows, drop_index)
    pg0 = ctx.cluster.cpu()
    drained = asyncio.run(acquire_finish_drain(dsn, rows, batch, seconds_limit))
    pg_cpu = ctx.cluster.cpu() - pg0
    out = {**_figures(drained["rows"], drained["seconds"], pg_cpu), "complete": drained["complete"],
           **end_state(dsn)}
    ctx.cluster.drop_database(name)
    return out


def secondary_indexes(ctx: Context) -> list[dict[str, str]]:
    """The queue's and the audit log's indexes other than their primary keys, as migrated."""
    # read from a copy: a session on the template would hold up the next copy of it
    name = "bench_features_catalog"
    found = query(
        ctx.cluster.new_database(name),
        "SELECT c.relname, t.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid"
        " WHERE i.indrelid IN ('webhooks.alert_delivery_queue'::regclass,"
        "                      'webhooks.alert_delivery_log'::regclass) AND NOT i.indisprimary"
        " ORDER BY t.relname DESC, c.relname")
    ctx.cluster.drop_database(name)
    return [{"index": index, "table": table, "definition": definition} for index, table, definition in found]


# --- the section -----------------------------------------------------------------------------------


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--features-index-rows", type=int, default=20_000,
                       help="rows for each drain of the features section's index prices, at most --db-rows"
                            " (20,000)")


def _priced(runs: list[dict[str, Any]], before: dict[str, Any] | None) -> dict[str, Any]:
    """A variant's median with its values, and its price: its median minus the one before's."""
    cpu = median_of([r["pg_cpu_us_per_delivery"] for r in runs])
    return {"runs": runs, "pg_cpu_us_per_delivery": cpu,
            "price_us": None if before is None else round(
                cpu["median"] - before["pg_cpu_us_per_delivery"]["median"], 1)}


def run(ctx: Context) -> dict[str, Any]:
    """The ladder, then each index (see the module's docstring and README, section `features`)."""
    rows = min(ctx.args.rows, ctx.args.db_rows)
    index_rows = min(rows, ctx.args.features_index_rows)
    batch = ctx.settings.claim_batch_size or 100
    out: dict[str, Any] = {"rows": rows, "index_rows": index_rows, "batch_size": batch, "rounds": ROUNDS,
                           "load_average_before": machine_load()}

    # The ladder: every step and the product once per round, in order, three rounds.
    ladder_runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in LADDER}
    ladder_runs[FULL] = []
    for _ in range(ROUNDS):
        for step in LADDER:
            ladder_runs[step.name].append(model_run(ctx, step, rows, batch))
        ladder_runs[FULL].append(product_run(ctx, rows, batch))
    ladder: list[dict[str, Any]] = []
    for name, adds in [*((s.name, s.adds) for s in LADDER), (FULL, FULL_ADDS)]:
        before = ladder[-1] if ladder else None
        ladder.append({"step": name, "adds": adds, **_priced(ladder_runs[name], before)})
    out["ladder"] = ladder

    # Each index: the product's drain with all of them, then with each dropped, in rounds. A drain
    # that takes far longer than with all indexes is stopped and reported as pathological once.
    indexes = secondary_indexes(ctx)
    all_runs: list[dict[str, Any]] = []
    dropped_runs: dict[str, list[dict[str, Any]]] = {ix["index"]: [] for ix in indexes}
    pathological: dict[str, dict[str, Any]] = {}
    for _ in range(ROUNDS):
        baseline = product_run(ctx, index_rows, batch)
        all_runs.append(baseline)
        limit = max(PATHOLOGICAL_MIN_SECONDS, PATHOLOGICAL_FACTOR * baseline["seconds"])
        for ix in indexes:
            if ix["index"] in pathological:
                continue
            run = product_run(ctx, index_rows, batch, drop_index=ix["index"], seconds_limit=limit)
            if run["complete"]:
                dropped_runs[ix["index"]].append(run)
            else:
                pathological[ix["index"]] = {**run, "seconds_limit": round(limit, 1)}
    with_all = _priced(all_runs, None)
    out["indexes"] = {"all": with_all, "dropped": []}
    for ix in indexes:
        entry: dict[str, Any] = dict(ix)
        if ix["index"] in pathological:
            entry["pathological"] = pathological[ix["index"]]
            entry["price_us"] = None
        else:
            without = median_of([r["pg_cpu_us_per_delivery"] for r in dropped_runs[ix["index"]]])
            entry["runs"], entry["pg_cpu_us_per_delivery"] = dropped_runs[ix["index"]], without
            # the index's price: what a delivery costs with it minus what it costs without it
            entry["price_us"] = round(with_all["pg_cpu_us_per_delivery"]["median"] - without["median"], 1)
        out["indexes"]["dropped"].append(entry)
    out["load_average_after"] = machine_load()
    return out


def runs_overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether the runs of two figures overlap: their difference is then the machine's noise, not
    a price that was measured."""
    return not (min(a["values"]) > max(b["values"]) or max(a["values"]) < min(b["values"]))


def figures(f: dict[str, Any]) -> Figures:
    """The section's rows in the benchmark's printed table."""
    def values(m: dict[str, Any]) -> str:
        return f"{m['median']:,.1f} µs (of {', '.join(f'{v:,.1f}' for v in m['values'])})"

    def noise(a: dict[str, Any], b: dict[str, Any]) -> str:
        return " (the runs overlap: noise)" if runs_overlap(a, b) else ""

    lines = [(f"11. feature prices: PG CPU µs/delivery, model ladder ({f['rows']:,} rows, batch "
              f"{f['batch_size']}, median of {f['rounds']})", "each step = the one above + one feature")]
    for before, step in zip([None, *f["ladder"]], f["ladder"], strict=False):
        price = "" if before is None else f"; price {step['price_us']:+,.1f} µs" + noise(
            step["pg_cpu_us_per_delivery"], before["pg_cpu_us_per_delivery"])
        if step["step"] == FULL:
            label, price = f"{FULL} (the product)", price + " (what the model leaves out)"
        else:
            label = step["step"] if step["price_us"] is None else "+ " + step["step"]
        lines.append((f"   {label}", values(step["pg_cpu_us_per_delivery"]) + price))
    ix = f["indexes"]
    lines.append((f"   indexes: full drain with all ({f['index_rows']:,} rows)",
                  values(ix["all"]["pg_cpu_us_per_delivery"])))
    for entry in ix["dropped"]:
        if entry.get("pathological"):
            p = entry["pathological"]
            figure = (f"pathological without it: {p['rows']:,} of {f['index_rows']:,} rows in "
                      f"{p['seconds']} s ({p['pg_cpu_us_per_delivery']:,.0f} µs/delivery); not priced")
        else:
            # negative: the drain costs more without the index (its plans are worse) than with it
            price, without = entry["price_us"], values(entry["pg_cpu_us_per_delivery"])
            figure = (f"costs {price:,.1f} µs" if price >= 0 else f"saves {-price:,.1f} µs") + noise(
                entry["pg_cpu_us_per_delivery"], ix["all"]["pg_cpu_us_per_delivery"]) + (
                f"; without it {without}")
        lines.append((f"   - {entry['index']}", figure))
    lines.append(("   load average (1, 5, 15 min) before, after",
                  f"{f['load_average_before']}, {f['load_average_after']}"))
    return lines


SECTION = Section("features", run, options=options, figures=figures, quick={"features_index_rows": 300})
