"""Regenerate a migration fixture: a database migrated by a git revision, rows in every state, dumped.

    python -m tests.migration.make_fixture REVISION tests/migration/fixtures/schema_v35.sql

The database is migrated by that revision's own `webhook-worker migrate` (its worker/ and sql/,
taken with `git archive`), filled through the schema's functions, and dumped with pg_dump (schema and
data, no owner: the test restores it as its own user). schema_v35.sql was made from 7659895, the
last commit of the numbered layout before the baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from bench.localworker import stored
from worker.encryption import KEYS_ENV, Keyring
from worker.localpg import LocalPostgres, _find_binary
from worker.rules import signing
from worker.rules.redaction import display_url
from worker.store.endpoints import EndpointSpec, register_endpoint

# A key for this fixture only (it seals the fixture endpoints' URL and secrets): the migration test
# gives it to the worker that finishes the fixture's rows. It protects nothing else.
FIXTURE_KEYS = "2pJaEmHHSPPq9aIYzMFfcd+LYBHIgr3Tc8IdvkzZcEE="


def migrate_as_of(revision: str, url: str) -> int:
    """Migrate with the revision's own code; returns the schema version it reached."""
    with tempfile.TemporaryDirectory(prefix="webhook-worker-rev-") as checkout:
        archive = subprocess.run(["git", "archive", revision, "worker", "sql"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", checkout], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": checkout}
        program = "import sys; from worker import schema; schema.migrate(sys.argv[1])"
        subprocess.run([sys.executable, "-c", program, url], check=True, cwd=checkout, env=env)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT max(version) FROM webhooks.schema_migrations").fetchone()
    assert row is not None
    return int(row[0])


def claim(conn: psycopg.Connection, worker: str, batch: int) -> list[tuple[int, str, int]]:
    rows = conn.execute("SELECT delivery_id, lease_token::text, attempt FROM webhooks.acquire(%s, %s, 30)",
                        (worker, batch)).fetchall()
    return [(int(r[0]), str(r[1]), int(r[2])) for r in rows]


def finish(conn: psycopg.Connection, worker: str, claimed: tuple[int, str, int], **fields: object) -> None:
    delivery_id, token, attempt = claimed
    conn.execute("SELECT * FROM webhooks.finish(%s, %s)", (worker, json.dumps(
        [{"delivery_id": delivery_id, "lease_token": token, "attempt": attempt, **fields}])))


def fill(url: str) -> None:
    """Rows in every state: pending (due, later, ordered behind a head), retrying, deferred,
    delivering under a lease, delivered, dead letter (4xx and exhausted), a disabled endpoint's rows,
    audit and health rows, endpoint events."""
    keyring = Keyring.parse(FIXTURE_KEYS, KEYS_ENV)
    with psycopg.connect(url, autocommit=True) as conn:
        main, spare, disabled = (stored(url, register_endpoint, EndpointSpec(
            name=name, url=f"http://127.0.0.1:9/{name}", url_display=display_url(f"http://127.0.0.1:9/{name}"),
            signing_secrets=(signing.generate_secret(),), headers={"Authorization": "Bearer fixture"}),
            keyring)
            for name in ("fixture-main", "fixture-spare", "fixture-disabled"))
        conn.execute("UPDATE webhooks.delivery_config SET max_attempts = 3")
        conn.execute("SELECT webhooks.disable_endpoint(%s, 'taken out for the fixture')", (disabled,))

        def enqueue(endpoint: int, count: int, **columns: object) -> None:
            names = ", ".join(columns)
            conn.execute(
                "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload"
                + (f", {names}" if names else "") + ") SELECT %s, 'alert.created', jsonb_build_object('n', n)"
                + "".join(", %s" for _ in columns) + " FROM generate_series(1, %s) n",
                (endpoint, *columns.values(), count))

        registration = psycopg.connect(url, autocommit=True)
        registration.execute("SELECT * FROM webhooks.register_worker('fixture-worker', gen_random_uuid())")
        try:
            enqueue(spare, 6)
            delivered, dead, retrying, deferred, exhausted, in_flight = claim(conn, "fixture-worker", 6)
            finish(conn, "fixture-worker", delivered, outcome="delivered", http_status=200, latency_ms=4)
            finish(conn, "fixture-worker", dead, outcome="dead_letter", http_status=400,
                   failure_category="http_4xx", error="HTTP 400")
            finish(conn, "fixture-worker", retrying, outcome="retry", http_status=503,
                   failure_category="http_5xx", error="HTTP 503", retry_after_s=1)
            finish(conn, "fixture-worker", deferred, outcome="deferred", http_status=429,
                   failure_category="rate_limited", error="HTTP 429", retry_after_s=1)
            conn.execute("UPDATE webhooks.alert_delivery_queue SET attempts = 3 WHERE delivery_id = %s",
                         (exhausted[0],))
            finish(conn, "fixture-worker", exhausted, outcome="retry", error="timed out",
                   failure_category="timeout")
            del in_flight  # left delivering under its lease
        finally:
            registration.close()
        enqueue(main, 3)
        enqueue(main, 2, ordering_key="fixture-order")
        enqueue(main, 1, next_retry_at="2100-01-01T00:00:00Z")
        enqueue(disabled, 1)


def main(revision: str, output: Path) -> None:
    with LocalPostgres() as local:
        with psycopg.connect(local.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE fixture")
        url = local.url.rsplit("/", 1)[0] + "/fixture"
        version = migrate_as_of(revision, url)
        fill(url)
        dump = subprocess.run([_find_binary("pg_dump"), "--no-owner", "--schema=webhooks", url],
                              check=True, capture_output=True, text=True).stdout
    header = (f"-- The schema at version {version} with rows in every state, for the migration test.\n"
              f"-- Made by `python -m tests.migration.make_fixture {revision}` (that revision's migrate,\n"
              "-- rows through the schema's functions, pg_dump --no-owner); do not edit.\n")
    output.write_text(header + dump, encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
