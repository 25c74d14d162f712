# ruff: noqa: E501 - the mutants are a table of SQL lines, kept one to a line
"""Hand-made mutants of sql/functions/: each plants one realistic one-line bug in a
function that guards a promise, runs the tests that should notice, and puts the file back.

    .venv/bin/python scripts/sql_mutants.py            # every mutant, one after another
    .venv/bin/python scripts/sql_mutants.py 3 17       # some of them, by number
    .venv/bin/python scripts/sql_mutants.py --list     # what each one changes
Each mutant runs the tests listed for it, then tests/integration/test_sql_guards.py (the fast SQL
tests written for the mutants the others missed); `--also PATH` names another file for that second
run. A mutant is caught when either run fails.

Caught: the tests failed (pytest exit code 1). Survived: they passed. A mutant whose original
line is no longer in its file is reported as `gone` (the function changed: update the list). Not
part of scripts/test.sh: each mutant starts its own PostgreSQL and takes a while. The file is
restored even when interrupted (Ctrl-C), and the run refuses to start over uncommitted SQL.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = ROOT / "sql" / "functions"
PER_MUTANT_TIMEOUT = 900


@dataclass(frozen=True)
class Mutant:
    file: str
    original: str
    mutated: str
    tests: tuple[str, ...]  # pytest arguments (one -k expression at most): paths, node ids, -k expressions
    what: str
    nth: int = 1  # which occurrence of `original` (for a line that appears more than once)


def k(path: str, expression: str) -> tuple[str, ...]:
    return (path, "-k", expression)


SQL = "tests/integration/test_sql.py"
PROMISES = "tests/integration/test_promises.py"
TENANTS = "tests/integration/test_tenants.py"
COALESCING = "tests/integration/test_coalescing.py"
LIMITS = "tests/integration/test_claim_limits.py"
RETENTION = "tests/integration/test_retention.py"
GATE = "tests/integration/test_gate.py"
GATE_API = "tests/api/test_gate_api.py"
RECLAIM = "tests/integration/test_message_reclaim.py"
MESSAGES = "tests/integration/test_messages.py"
LIFECYCLE = "tests/api/test_endpoint_lifecycle.py"
ISOLATION = "tests/api/test_tenant_isolation.py"

MUTANTS: list[Mutant] = [
    # --- claim.sql: which rows and endpoints a claim may take ---
    Mutant("claim.sql", "WHERE q.status IN ('pending', 'retrying')\n  AND (q.ordering_key IS NULL",
           "WHERE q.status IN ('pending', 'retrying', 'dead_letter')\n  AND (q.ordering_key IS NULL",
           (SQL,), "claimable: dead letters are claimable"),
    Mutant("claim.sql", "        AND o.delivery_id < q.delivery_id\n",
           "        AND o.delivery_id > q.delivery_id\n",
           k(SQL, "ordering"), "claimable: the last row of an ordering key goes first"),
    Mutant("claim.sql", "        WHERE q.status = 'delivering' AND q.locked_until < now()\n",
           "        WHERE q.status = 'delivering' AND q.locked_until > now()\n",
           k(SQL, "lease"), "reaper: live leases are ended, expired ones kept"),
    Mutant("claim.sql", "               t.max_in_flight - t.flying,\n", "               t.max_in_flight,\n",
           k(SQL, "cap or crowd"), "quota: rows in flight do not count against max_in_flight"),
    Mutant("claim.sql", "ELSE floor(t.tokens_now)::integer END", "ELSE round(t.tokens_now)::integer END",
           (*k(COALESCING, "rate or token"), LIMITS), "quota: a fractional rate token rounds up to a request"),
    Mutant("claim.sql", "CASE t.circuit_state WHEN 'open' THEN t.probes",
           "CASE t.circuit_state WHEN 'open' THEN p_batch_size",
           k(PROMISES, "probe or circuit"), "quota: an open circuit whose sleep is over sends a batch, not probes"),
    Mutant("claim.sql", "WHEN 'half_open' THEN t.probes - t.probe_results - t.flying",
           "WHEN 'half_open' THEN t.probes - t.probe_results",
           k(PROMISES, "probe or circuit"), "quota: probes in flight not counted in half-open"),
    Mutant("claim.sql", "              AND (h2.paused_until IS NULL OR h2.paused_until <= now())\n",
           "              AND (h2.paused_until IS NULL OR h2.paused_until >= now())\n",
           k(SQL, "deferral or pause"), "endpoints: a Retry-After pause is ignored (first check)"),
    Mutant("claim.sql", "              AND h2.circuit_state <> 'forced_open'\n", "",
           (*k(SQL, "circuit"), *k(PROMISES, "circuit")), "endpoints: a forced-open circuit still sends (first check)"),
    Mutant("claim.sql", "            attempts = q.attempts + 1,\n", "            attempts = q.attempts,\n",
           k(SQL, "attempts or lease"), "full claim: the attempt is not counted when claimed", nth=2),
    Mutant("claim.sql", "                    WHEN NOT t.id = ANY (coalesce(p_tenants, '{}')) THEN 0\n",
           "                    WHEN NOT t.id = ANY (coalesce(p_tenants, '{}')) THEN p_batch_size\n",
           k(TENANTS, "rate_limit or in_flight"), "tenant quota: a limited tenant held by another claim is unlimited"),
    Mutant("claim.sql", "                               t.max_in_flight - f.flying,\n",
           "                               t.max_in_flight,\n",
           k(TENANTS, "in_flight"), "tenant quota: rows in flight do not count against the tenant cap"),
    Mutant("claim.sql", "            WHERE (p_tenants IS NULL OR t.name = ANY (p_tenants))\n",
           "            WHERE (p_tenants IS NULL OR NOT t.name = ANY (p_tenants))\n",
           k(TENANTS, "pool"), "pools: a pool claims the other tenants' rows"),
    Mutant("claim.sql", "          AND q.lease_token = l.lease_token\n", "",
           k(SQL, "release"), "release: any lease of the row is released, not only the worker's own"),
    Mutant("claim.sql", "            attempts = q.attempts - 1,\n", "            attempts = q.attempts,\n",
           k(SQL, "release"), "release: the attempt is not given back"),
    # --- finish.sql: fencing, decisions, the endpoint's health ---
    Mutant("finish.sql", "AND q.delivery_id = t.delivery_id AND q.lease_token = t.lease_token",
           "AND q.delivery_id = t.delivery_id",
           k(SQL, "fencing or lease or stale"), "fencing: a finish under an old lease token is applied"),
    Mutant("finish.sql", "left(t.response_excerpt, 1024), p_worker_id, t.lease_token, a.delivery_id IS NULL,",
           "left(t.response_excerpt, 1024), p_worker_id, t.lease_token, false,",
           k(SQL, "fencing or stale"), "fencing: a late outcome is not marked stale in the audit log"),
    Mutant("finish.sql", "WHEN q.attempts >= coalesce(q.max_attempts, e.max_attempts, cfg.max_attempts)",
           "WHEN q.attempts > coalesce(q.max_attempts, e.max_attempts, cfg.max_attempts)",
           k(SQL, "max_attempts or dead_letter"), "finish: one attempt more than max_attempts"),
    Mutant("finish.sql", "WHEN o.outcome = 'deferred' AND q.deferrals < cfg.max_deferrals THEN 'deferred'",
           "WHEN o.outcome = 'deferred' AND q.deferrals <= cfg.max_deferrals THEN 'deferred'",
           k(PROMISES, "deferral"), "finish: one deferral more than max_deferrals"),
    Mutant("finish.sql", "attempts = CASE WHEN t.decision = 'deferred' THEN q.attempts - 1 ELSE q.attempts END,",
           "attempts = q.attempts,",
           k(SQL, "deferral"), "finish: a deferral does not give its attempt back"),
    Mutant("finish.sql", "          AND t.reports_request\n", "",
           k(COALESCING, "counts_once"), "digests: each member counts in the endpoint's health"),
    Mutant("finish.sql", "              AND l.worker_id = p_worker_id AND NOT l.stale\n",
           "              AND l.worker_id = p_worker_id\n",
           k(SQL, "sent_again or fencing"), "finish: a stale outcome of this worker is answered as applied"),
    Mutant("finish.sql", "              AND x.successes = x.attempts AND x.pause_seconds IS NULL AND x.gone_delivery_id IS NULL\n",
           "              AND x.pause_seconds IS NULL AND x.gone_delivery_id IS NULL\n",
           k(SQL, "short_health"), "health: a batch with a failure takes the short update, as if all were delivered"),
    Mutant("finish.sql", "              AND h.circuit_state = 'closed' AND h.window_failures = 0 AND h.previous_failures = 0\n",
           "              AND h.window_failures = 0 AND h.previous_failures = 0\n",
           k(SQL, "short_health"), "health: a half-open circuit takes the short update and never closes"),
    Mutant("finish.sql", "OR coalesce(p_http_status IN (408, 429) OR p_http_status >= 500, false);",
           "OR coalesce(p_http_status IN (408, 429) OR p_http_status >= 400, false);",
           k(PROMISES, "400"), "circuit: a 4xx counts as the receiver being unavailable"),
    Mutant("finish.sql", "AND e.est_failures::numeric >= e.failure_ratio::numeric * e.est_attempts::numeric",
           "AND e.est_failures::numeric > e.failure_ratio::numeric * e.est_attempts::numeric",
           k(PROMISES, "circuit"), "circuit: exactly the failure ratio does not open it"),
    Mutant("finish.sql", "AND e.est_failures::numeric >= e.failure_ratio::numeric * e.est_attempts::numeric",
           "AND e.est_failures >= e.failure_ratio * e.est_attempts",
           k(PROMISES, "circuit"), "circuit: the failure ratio compared as a widened real (0.6 read as 0.6000000238)"),
    Mutant("finish.sql", "ceil(w.probe_success_ratio::numeric * w.probes) AS probes_needed",
           "ceil(w.probe_success_ratio * w.probes) AS probes_needed",
           k(PROMISES, "probe or circuit"), "circuit: the probe success ratio compared as a widened real (4 of 5 needed, not 3)"),
    # --- replays (put back in the queue by the gate, enqueue.sql) ---
    Mutant("enqueue.sql", "SET status = 'pending', attempts = 0, deferrals = 0, replays = q.replays + 1,",
           "SET status = 'pending', deferrals = 0, replays = q.replays + 1,",
           (*k(SQL, "replay"), *k(PROMISES, "replay")), "replay: attempts are not reset"),
    Mutant("enqueue.sql", "WHERE q.delivery_id = ANY (p_replays) AND q.status IN ('dead_letter', 'delivered')",
           "WHERE q.delivery_id = ANY (p_replays) AND q.status IN ('dead_letter', 'delivered', 'delivering')",
           k(SQL, "replay"), "replay: a row in flight is put back in the queue"),
    Mutant("enqueue.sql", "                digest_id = NULL\n", "                digest_id = q.digest_id\n",
           k(COALESCING, "failed_digest"), "replay: a replayed member goes back into its digest"),
    # --- tenants in views and functions ---
    Mutant("replay.sql", "          AND (v_tenant IS NULL OR q.tenant_id = v_tenant)\n", "",
           k(TENANTS, "replay"), "replay --all --tenant T replays every tenant's dead letters"),
    Mutant("replay.sql",
           "WHERE (SELECT webhooks.caller_tenant()) IS NULL OR q.tenant_id = (SELECT webhooks.caller_tenant());",
           "WHERE true;",
           ("tests/api/test_tenant_isolation.py",), "delivery_overview shows every tenant's rows"),
    # --- api.sql and console.sql: tokens and sessions ---
    Mutant("api.sql", "      AND (t.expires_at IS NULL OR t.expires_at > now());",
           "      AND (t.expires_at IS NULL OR t.expires_at > now() - interval '1 day');",
           k("tests/api/test_auth.py", "expired or revoked"), "tokens: an expired token works for a day more"),
    Mutant("api.sql", "    WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL",
           "    WHERE t.token_hash = p_token_hash",
           k("tests/api/test_auth.py", "expired or revoked"), "tokens: a revoked token still works"),
    Mutant("api.sql", "    PERFORM webhooks.api_publish_begin(p_token_hash, p_roles, p_catalogue_version);\n    RETURN QUERY SELECT b.ordinal",
           "    RETURN QUERY SELECT b.ordinal",
           k("tests/api/test_auth.py", "expired or revoked"), "tokens: a batch publish under a revoked token is not refused (28000)"),
    Mutant("api.sql", "    PERFORM webhooks.api_publish_begin(p_token_hash, p_roles, p_catalogue_version);\n    RETURN QUERY SELECT p.delivery_id",
           "    RETURN QUERY SELECT p.delivery_id",
           k("tests/api/test_auth.py", "expired or revoked"), "tokens: a publish under a revoked token is not refused (28000)"),
    Mutant("api.sql", "                   WHERE a.role = ANY (p_roles)) THEN\n",
           "                   WHERE true) THEN\n",
           k("tests/api/test_auth.py", "role or may"), "tokens: a publish under a token whose role may not publish is let through"),
    Mutant("console.sql", "    WHERE s.session_hash = p_session_hash AND s.expires_at > now();",
           "    WHERE s.session_hash = p_session_hash;",
           k("tests/api/test_console.py", "session"), "console: a session past its lifetime still works"),
    # --- enqueue.sql: idempotency ---
    Mutant("enqueue.sql", "    IF NEW.idempotency_key IS NULL THEN\n        NEW.idempotency_key := NEW.event_id;",
           "    IF NEW.idempotency_key IS NULL THEN\n        NEW.idempotency_key := gen_random_uuid()::text;",
           k(SQL, "idempotency or duplicate"), "enqueue: a plain insert's key is not its event id"),
    # --- enqueue.sql: the gate, queue_deliveries() ---
    Mutant("enqueue.sql", "                                                    WHERE e.id = v_hook[1] AND e.tenant_id = v_tenant) THEN\n",
           "                                                    WHERE e.id = v_hook[1]) THEN\n",
           (*k(GATE, "tenant"), ISOLATION), "gate, tenant: a request may address another tenant's endpoint"),
    Mutant("enqueue.sql", "                                                           WHERE e.id = r.webhook_id AND e.tenant_id = v_tenant)),\n",
           "                                                           WHERE e.id = r.webhook_id)),\n",
           (*k(GATE, "tenant"), ISOLATION), "gate, tenant: a batch may address another tenant's endpoint"),
    Mutant("enqueue.sql", "                   ELSE v_tenant IS NULL OR e.tenant_id = v_tenant END\n",
           "                   ELSE true END\n",
           k(GATE, "tenant"), "gate, tenant: a publish fans out to every tenant's subscribers"),
    Mutant("enqueue.sql", "                              ELSE v_tenant IS NULL OR e.tenant_id = v_tenant END\n",
           "                              ELSE true END\n",
           k(GATE, "tenant or many"), "gate, tenant: a batch fans out to every tenant's subscribers"),
    Mutant("enqueue.sql", "              AND (v_tenant IS NULL OR q.tenant_id = v_tenant)\n", "",
           (*k(TENANTS, "replay"), ISOLATION), "gate, tenant: a tenant's session replays another tenant's rows"),
    Mutant("enqueue.sql", "    IF p_caller IN ('api', 'test') THEN\n", "    IF p_caller IN ('test') THEN\n",
           k(GATE_API, "quota or fit or room"), "gate, quota: the API's publishes are not held to max_queued"),
    Mutant("enqueue.sql", "    IF p_caller IN ('api', 'test') THEN\n", "    IF p_caller IN ('api') THEN\n",
           k(GATE_API, "quota"), "gate, quota: test events are not held to max_queued"),
    Mutant("enqueue.sql", "n.rows > m.max_queued AS never,", "n.rows >= m.max_queued AS never,",
           k(GATE_API, "quota or fit or room"), "gate, quota: a message needing exactly max_queued can never fit"),
    Mutant("enqueue.sql", "OVER (PARTITION BY n.tenant_id ORDER BY n.i) > m.free AS over",
           "OVER (PARTITION BY n.tenant_id ORDER BY n.i) >= m.free AS over",
           k(GATE_API, "quota or fit or room"), "gate, quota: a message filling the room exactly is refused"),
    Mutant("enqueue.sql", "AND q.status IN ('pending', 'retrying', 'delivering')",
           "AND q.status IN ('pending', 'retrying')",
           k(GATE_API, "quota or fit or room"), "gate, quota: rows being sent do not count against max_queued"),
    Mutant("enqueue.sql", "                WHERE NOT t.kept\n                  AND NOT EXISTS",
           "                WHERE true\n                  AND NOT EXISTS",
           (*k(GATE_API, "quota or fit or room"), *k(LIFECYCLE, "disabled")),
           "gate, quota: a message kept for disabled subscribers counts against max_queued"),
    Mutant("enqueue.sql", "               coalesce(array_agg(NOT e.active ORDER BY e.id), '{}')\n",
           "               coalesce(array_agg(false ORDER BY e.id), '{}')\n",
           (*k(GATE, "disabled or enabled"), *k(LIFECYCLE, "disabled")), "gate, disabled: a publish fans out to disabled subscribers"),
    Mutant("enqueue.sql", "            WHERE NOT t.kept\n               OR NOT EXISTS",
           "            WHERE true\n               OR NOT EXISTS",
           (*k(GATE, "disabled or enabled"), *k(LIFECYCLE, "disabled")),
           "gate, disabled: disabled subscribers get dead letters beside enabled ones"),
    Mutant("enqueue.sql", "            WHERE t.active OR NOT t.any_active\n", "            WHERE true\n",
           (*k(GATE, "disabled or enabled or many"), *k(LIFECYCLE, "disabled")),
           "gate, disabled: in a batch, disabled subscribers get rows beside enabled ones"),
    Mutant("enqueue.sql", "            IF NOT v_row.active THEN\n", "            IF false THEN\n",
           k(GATE_API, "disabled"), "gate, disabled: a test event to a disabled endpoint is queued"),
    Mutant("enqueue.sql", "            IF cardinality(v_sent) >= TEST_EVENTS_PER_MINUTE THEN\n",
           "            IF cardinality(v_sent) > TEST_EVENTS_PER_MINUTE THEN\n",
           k(GATE_API, "limited"), "gate, test events: one more than 10 a minute"),
    Mutant("enqueue.sql", "WHERE t > now() - interval '1 minute' ORDER BY t)",
           "WHERE t > now() - interval '1 hour' ORDER BY t)",
           k(GATE_API, "limited"), "gate, test events: the rate's window is an hour, not a minute"),
    Mutant("enqueue.sql", "    IF v_reserved IS NOT NULL AND (p_caller = 'api' OR (p_caller = 'producer'",
           "    IF v_reserved IS NOT NULL AND (false OR (p_caller = 'producer'",
           ("tests/api/test_routes.py", "-k", "reserved"), "gate, reserved types: the API's callers may queue webhook.* events"),
    Mutant("enqueue.sql", "          AND webhooks.subscribes(CASE WHEN v_reserved IS NOT NULL THEN array_remove(e.event_types, '*')\n",
           "          AND webhooks.subscribes(CASE WHEN v_reserved IS NOT NULL THEN e.event_types\n",
           (*k(GATE, "operational"), *k(SQL, "operational or notice")), "gate, reserved types: '*' takes the worker's own events"),
    # --- enqueue.sql: a message's range of delivery ids (fill_idempotency_key) ---
    Mutant("enqueue.sql", "        SET first_delivery_id = least(m.first_delivery_id, NEW.delivery_id),\n",
           "        SET first_delivery_id = m.first_delivery_id,\n",
           (RECLAIM, MESSAGES), "range: a message lent to a row with a lower id does not widen down to it"),
    Mutant("enqueue.sql", "            last_delivery_id = greatest(m.last_delivery_id, NEW.delivery_id)\n",
           "            last_delivery_id = m.last_delivery_id\n",
           (RECLAIM, MESSAGES), "range: a message lent to a later row does not widen up to it"),
    Mutant("enqueue.sql", "                  - least(o.first_delivery_id, NEW.delivery_id) < 1000\n",
           "                  - least(o.first_delivery_id, NEW.delivery_id) < 1000000\n",
           k(RECLAIM, "thousand"), "range: a message's range grows past 1,000 ids"),
    Mutant("enqueue.sql", " AND o.created_at = now()\n", "\n",
           (RECLAIM, MESSAGES), "range: a row borrows the message of an earlier transaction"),
    Mutant("enqueue.sql", "        IF FOUND THEN\n            RETURN NEW;\n        END IF;\n        -- The same event",
           "        -- The same event",
           (RECLAIM, MESSAGES), "range: a row whose key is taken borrows a message from the row being deleted"),
    Mutant("enqueue.sql", "                                    THEN greatest(m.last_delivery_id, NEW.delivery_id) END\n",
           "                                    THEN m.last_delivery_id END\n",
           (RECLAIM, MESSAGES), "range: a row given its message does not widen its range"),
    # --- retention.sql: the reclaim ---
    Mutant("retention.sql", "      AND m.first_delivery_id = o.delivery_id AND m.last_delivery_id = o.delivery_id;\n",
           "      AND m.first_delivery_id = o.delivery_id;\n",
           (RECLAIM, MESSAGES), "release_messages: a message goes with its first delivery"),
    Mutant("retention.sql", "    ORDER BY m.message_id\n    FOR UPDATE;\n", "    ORDER BY m.message_id;\n",
           k(RECLAIM, "two_sessions or racing"), "release_messages: messages not locked before they are looked at"),
    Mutant("retention.sql", "           WHERE q.delivery_id BETWEEN m.first_delivery_id AND m.last_delivery_id\n             AND q.message_id = m.message_id\n",
           "           WHERE q.delivery_id BETWEEN m.first_delivery_id AND m.last_delivery_id\n",
           (RECLAIM, MESSAGES), "release_messages: another message's delivery in the range keeps a message"),
    Mutant("retention.sql", "           WHERE q.delivery_id BETWEEN m.first_delivery_id AND m.last_delivery_id\n",
           "           WHERE q.delivery_id BETWEEN m.first_delivery_id AND m.first_delivery_id\n",
           (RECLAIM, MESSAGES), "release_messages: only a message's first delivery is looked for"),
    Mutant("retention.sql", "    IF pg_snapshot_xmin(pg_current_snapshot()) < v_sweep.bound_xmax THEN\n",
           "    IF false THEN\n",
           k(RECLAIM, "swept"), "sweep_messages: sweeps while a transaction that may be making a message is open"),
    Mutant("retention.sql", "           ORDER BY q.delivery_id LIMIT 1) IS NULL;\n    GET DIAGNOSTICS",
           "           ORDER BY q.delivery_id LIMIT 1) IS NOT NULL;\n    GET DIAGNOSTICS",
           k(RECLAIM, "swept"), "sweep_messages: deletes the messages that have deliveries"),
    Mutant("retention.sql", "    v_through := least(v_sweep.bound, v_sweep.swept_through + p_limit);\n",
           "    v_through := greatest(v_sweep.bound, v_sweep.swept_through + p_limit);\n",
           k(RECLAIM, "swept"), "sweep_messages: sweeps past its bound"),
    Mutant("retention.sql", "    PERFORM webhooks.sweep_messages(p_batch_size * 10);\n", "",
           k(RECLAIM, "swept"), "purge: no sweep of messages a skipped insert made"),
    # --- retention.sql ---
    Mutant("retention.sql", "        WHERE q.status = 'delivered' AND q.delivered_at < now() - cfg.delivered_retention\n",
           "        WHERE q.status IN ('delivered', 'dead_letter') AND q.delivered_at < now() - cfg.delivered_retention\n",
           ("tests/acceptance/test_operator_cli.py", RETENTION, "-k", "retention"), "purge: dead letters go with delivered rows"),
    Mutant("retention.sql",
           "          AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1 <= (now() - cfg.log_retention)::date\n",
           "          AND to_date(right(c.relname, 8), 'YYYYMMDD') <= (now() - cfg.log_retention)::date\n",
           ("tests/acceptance/test_operator_cli.py", RETENTION, "-k", "retention"),
           "purge: the partition of the day still inside retention is dropped"),
]


def pytest(args: list[str]) -> tuple[str, str]:
    """Run the tests on the tree as it is now: (verdict, pytest's last line)."""
    try:
        proc = subprocess.run([str(ROOT / ".venv/bin/pytest"), "-q", "-x", "-p", "no:cacheprovider", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=PER_MUTANT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    verdict = {0: "SURVIVED", 1: "caught", 5: "no tests ran"}.get(proc.returncode, f"error (exit {proc.returncode})")
    return verdict, (proc.stdout.strip().splitlines()[-1:] or [""])[0]


def run(numbers: list[int], also: str | None) -> int:
    # a kill ends the run through the `finally` that puts the file back
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    dirty = subprocess.run(["git", "status", "--porcelain", "sql/functions"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    if dirty.strip():
        print(f"sql/functions has uncommitted changes; commit or stash them first:\n{dirty}", file=sys.stderr)
        return 2
    results: list[tuple[int, Mutant, str, float]] = []
    for number in numbers:
        mutant = MUTANTS[number - 1]
        path = FUNCTIONS / mutant.file
        text = path.read_text()
        at = -1
        for _ in range(mutant.nth):
            at = text.find(mutant.original, at + 1)
            if at < 0:
                break
        if at < 0:
            results.append((number, mutant, "gone", 0.0))
            print(f"#{number} gone: its original line is no longer in {mutant.file}", flush=True)
            continue
        started = time.monotonic()
        extra = ""
        try:
            path.write_text(text[:at] + mutant.mutated + text[at + len(mutant.original):])
            verdict, last = pytest(list(mutant.tests))
            if also:
                second, _ = pytest([also])
                extra = f"; {also}: " + second.replace("SURVIVED", "not caught")
                if second == "caught":
                    verdict = "caught" if verdict == "caught" else f"caught (only by {Path(also).name})"
        finally:
            path.write_text(text)
        took = time.monotonic() - started
        results.append((number, mutant, verdict, took))
        print(f"#{number} {verdict} ({took:.0f} s) {mutant.file}: {mutant.what} -- {last}{extra}", flush=True)
    print("\nfile             mutants caught survived")
    for file in sorted({m.file for _, m, _, _ in results}):
        mine = [v for _, m, v, _ in results if m.file == file]
        print(f"{file:16} {len(mine):7} {sum(v.startswith('caught') for v in mine):6} {mine.count('SURVIVED'):8}")
    caught = sum(v.startswith("caught") for *_, v, _ in results)
    print(f"all              {len(results):7} {caught:6} {sum(v == 'SURVIVED' for *_, v, _ in results):8}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--list"]:
        for number, m in enumerate(MUTANTS, 1):
            print(f"#{number} {m.file}: {m.what}\n    - {m.original.strip()}\n    + {m.mutated.strip()}")
        return 0
    also: str | None = "tests/integration/test_sql_guards.py"
    if "--also" in argv:
        at = argv.index("--also")
        also = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    numbers = [int(a) for a in argv] or list(range(1, len(MUTANTS) + 1))
    return run(numbers, also)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
