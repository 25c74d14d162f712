"""Regenerate the old-layout fixture: the old migrations of a git revision, rows in every state, dumped.

    python -m tests.migration.make_fixture REVISION tests/migration/fixtures/schema_v35.sql

REVISION is the last commit of the old layout (sql/NNN_name.sql at the top of sql/). The database is
migrated exactly as that layout's `webhook-worker migrate` did (each file once, in order, its checksum
recorded; then PUBLIC's EXECUTE revoked and the log partitions made), filled through the schema's own
functions, and dumped with pg_dump (schema and data, no owner: the test restores it as its own user).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import psycopg

from worker import signing
from worker.delivery import display_url
from worker.encryption import KEYS_ENV, Keyring
from worker.localpg import LocalPostgres, _find_binary
from worker.queue import EndpointSpec, register_endpoint

# A key for this fixture only (it seals the fixture endpoints' URL and secrets): the migration test
# gives it to the worker that finishes the fixture's rows. It protects nothing else.
FIXTURE_KEYS = "2pJaEmHHSPPq9aIYzMFfcd+LYBHIgr3Tc8IdvkzZcEE="
_OLD_NAME = re.compile(r"^sql/(\d{3})_([a-z0-9_]+)\.sql$")


def old_migrations(revision: str) -> list[tuple[int, str, str]]:
    names = subprocess.run(["git", "ls-tree", "--name-only", revision, "sql/"], check=True,
                           capture_output=True, text=True).stdout.split()
    found = []
    for name in sorted(names):
        match = _OLD_NAME.match(name)
        if match:
            text = subprocess.run(["git", "show", f"{revision}:{name}"], check=True,
                                  capture_output=True, text=True).stdout
            found.append((int(match[1]), match[2], text))
    return found


def migrate_old_layout(url: str, migrations: list[tuple[int, str, str]]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA webhooks")
        conn.execute("""CREATE TABLE webhooks.schema_migrations (
                            version    integer     PRIMARY KEY,
                            name       text        NOT NULL,
                            checksum   text        NOT NULL,
                            applied_at timestamptz NOT NULL DEFAULT now())""")
        for version, name, text in migrations:
            with conn.transaction():
                conn.execute(text.encode())
                conn.execute("INSERT INTO webhooks.schema_migrations (version, name, checksum)"
                             " VALUES (%s, %s, %s)",
                             (version, name, hashlib.sha256(text.encode()).hexdigest()))
        conn.execute("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC")
        conn.execute("SELECT webhooks.ensure_log_partitions()")


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
        main, spare, disabled = (register_endpoint(conn, EndpointSpec(
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
    migrations = old_migrations(revision)
    with LocalPostgres() as local:
        with psycopg.connect(local.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE fixture")
        url = local.url.replace("dbname=postgres", "dbname=fixture")
        migrate_old_layout(url, migrations)
        fill(url)
        dump = subprocess.run([_find_binary("pg_dump"), "--no-owner", "--schema=webhooks", url],
                              check=True, capture_output=True, text=True).stdout
    header = (f"-- The old layout's schema at version {migrations[-1][0]} with rows in every state, for the\n"
              f"-- migration test. Made by `python -m tests.migration.make_fixture {revision}` (migrations\n"
              "-- of that revision, rows through the schema's functions, pg_dump --no-owner); do not edit.\n")
    output.write_text(header + dump, encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
