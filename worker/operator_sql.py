"""The operator's SQL: synchronous calls over one psycopg connection, for the CLI, the demo and the
endpoint service (the API runs its endpoint writes through them too, in a thread)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import psycopg.sql
from psycopg.rows import dict_row

from worker import encryption
from worker.config import Config
from worker.encryption import DecryptionError, Keyring
from worker.registration import headers_problem, url_has_userinfo


def connect(config: Config, application_name: str = "webhook-worker") -> psycopg.Connection:
    """A connection for one operator command, in autocommit: each call is its own transaction
    unless it opens one."""
    return psycopg.connect(config.database.url, autocommit=True, application_name=application_name)


def point_in_time(conn: psycopg.Connection, value: str) -> datetime | None:
    """A timestamp as PostgreSQL reads one ('2026-11-26 12:00', 'today'), or a time that long ago
    ('1 hour ago', '90 minutes'), at the database's clock; None when it is neither."""
    ago = value.strip().removesuffix(" ago")
    for sql, given in (("SELECT %s::timestamptz", value), ("SELECT now() - %s::interval", ago)):
        try:
            with conn.transaction():
                row = conn.execute(sql, (given,)).fetchone()
        except psycopg.errors.DataError:
            continue
        if row is not None:
            return row[0]  # type: ignore[no-any-return]
    return None


# --- Endpoints ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    url: str
    url_display: str
    signing_secrets: tuple[str, ...]
    event_types: tuple[str, ...] = ("*",)
    headers: dict[str, str] = field(default_factory=dict)
    max_attempts: int | None = None
    timeout_ms: int | None = None
    retry_schedule: dict[str, Any] | None = None
    rate_limit_per_second: float | None = None
    rate_limit_burst: int | None = None
    max_in_flight: int | None = None
    circuit_policy: dict[str, Any] = field(default_factory=dict)
    body_format: str = "raw"
    secret_settings: dict[str, Any] = field(default_factory=dict, repr=False)
    active: bool = True
    tenant: str | None = None  # its name; None: the `default` tenant
    # every tenant's operational events, not only its own tenant's: the operator's channel
    operational_all_tenants: bool = False


class InvalidEndpoint(ValueError):
    """Endpoint settings that cannot be stored; the message names the field, never a credential."""


def register_endpoint(conn: psycopg.Connection, spec: EndpointSpec, keyring: Keyring) -> int:
    """Store an endpoint. Its URL, signing secrets, headers and secret settings are sealed bound to
    its id, so the row is inserted first and its credentials stored in the same transaction: nothing
    in plaintext, and nothing sealed without its row, is ever committed."""
    problem = headers_problem(spec.url, spec.headers)
    if problem is not None:
        raise InvalidEndpoint(f"headers: {problem}")
    with conn.transaction():
        row = conn.execute(
            "SELECT webhooks.register_endpoint(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s)",
            (
                spec.name,
                "",  # the credentials follow once the id they are bound to is known
                spec.url_display,
                "[]",
                list(spec.event_types),
                "{}",
                spec.max_attempts,
                spec.timeout_ms,
                json.dumps(spec.retry_schedule) if spec.retry_schedule is not None else None,
                # numeric in SQL: a float would arrive as double precision, which matches no signature
                None if spec.rate_limit_per_second is None else Decimal(str(spec.rate_limit_per_second)),
                spec.rate_limit_burst,
                spec.max_in_flight,
                json.dumps(spec.circuit_policy),
                spec.body_format,
                "{}",
                spec.active,
                spec.tenant,
                spec.operational_all_tenants,
            ),
        ).fetchone()
        assert row is not None
        endpoint_id = int(row[0])
        conn.execute(
            "SELECT webhooks.store_endpoint_credentials(%s, %s, %s, %s, %s)",
            (
                endpoint_id,
                keyring.seal(spec.url, encryption.URL, endpoint_id),
                json.dumps([
                    {"secret": keyring.seal(s, encryption.SIGNING_SECRET, endpoint_id), "expires_at": None}
                    for s in spec.signing_secrets
                ]),
                json.dumps(keyring.seal_settings(spec.secret_settings, endpoint_id)),
                json.dumps(keyring.seal_headers(spec.headers, endpoint_id)),
            ),
        )
    return endpoint_id


@dataclass(frozen=True)
class StoredCredentials:
    """An endpoint's credentials as stored (sealed), read for a change that depends on them."""

    url: str = field(repr=False)
    signing_secrets: list[dict[str, Any]] = field(repr=False)
    secret_settings: dict[str, str] = field(repr=False)
    headers: dict[str, str] = field(repr=False)


def stored_credentials(conn: psycopg.Connection, endpoint_id: int) -> StoredCredentials | None:
    """The endpoint's sealed credentials, locked until the caller's transaction ends."""
    row = conn.cursor(row_factory=dict_row).execute(
        "SELECT * FROM webhooks.endpoint_credentials(%s, 1)", (endpoint_id - 1,)
    ).fetchone()
    if row is None or row["id"] != endpoint_id:
        return None
    return StoredCredentials(row["url"], row["signing_secrets"], row["secret_settings"], row["headers"])


def find_endpoint(conn: psycopg.Connection, name_or_id: str) -> int | None:
    """The endpoint an ENDPOINT argument names: all digits is an id, anything else a name or
    TENANT/NAME (webhooks.endpoint_ref(); TooManyRows: a name held in more than one tenant)."""
    row = conn.execute("SELECT webhooks.endpoint_ref(%s)", (name_or_id,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def set_endpoint_active(conn: psycopg.Connection, endpoint_id: int, active: bool, reason: str) -> str | None:
    if active:
        row = conn.execute("SELECT webhooks.enable_endpoint(%s)", (endpoint_id,)).fetchone()
    else:
        row = conn.execute("SELECT webhooks.disable_endpoint(%s, %s)", (endpoint_id, reason)).fetchone()
    return None if row is None else row[0]


def delete_endpoint(conn: psycopg.Connection, endpoint_id: int, drop_pending: bool,
                    decided_by: str) -> int | None:
    """webhooks.api_delete_endpoint(), as the API deletes one: the rows dropped with it (made dead
    letters), or None when there is no such endpoint. Refused (ObjectInUse) while rows wait without
    drop_pending, and while any is being sent."""
    row = conn.execute("SELECT webhooks.api_delete_endpoint(%s, %s, %s)",
                       (endpoint_id, drop_pending, decided_by)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def set_circuit(conn: psycopg.Connection, endpoint_id: int, action: str, until: str | None) -> str:
    row = conn.execute("SELECT webhooks.set_circuit(%s, %s, %s)", (endpoint_id, action, until)).fetchone()
    assert row is not None
    return str(row[0])


# --- Deliveries, the queue and the defaults -----------------------------------------------------


def fetch_dicts(
    conn: psycopg.Connection, sql: str, params: Sequence[Any] | None = None
) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(sql, params)  # every caller passes a literal statement
    return cur.fetchall()


def endpoint_activity(conn: psycopg.Connection, endpoint_id: int) -> dict[str, Any]:
    """The endpoint's queued rows by status and its last state changes (`endpoints show`)."""
    return {
        "queued": dict(conn.execute(
            "SELECT status, count(*) FROM webhooks.alert_delivery_queue WHERE webhook_id = %s GROUP BY 1",
            (endpoint_id,),
        ).fetchall()),
        "events": fetch_dicts(
            conn,
            "SELECT change, reason, decided_by, delivery_id, at FROM webhooks.endpoint_events"
            " WHERE webhook_id = %s ORDER BY at DESC LIMIT 10",
            (endpoint_id,),
        ),
    }


def endpoint_coalescing(conn: psycopg.Connection, endpoint_id: int) -> tuple[str, int | None] | None:
    """The endpoint's body format and coalesce_max, for a change to either."""
    row = conn.execute("SELECT body_format, coalesce_max FROM webhooks.endpoints WHERE id = %s",
                       (endpoint_id,)).fetchone()
    return None if row is None else (str(row[0]), row[1])


def endpoint_format_and_settings(
    conn: psycopg.Connection, endpoint_id: int, keyring: Keyring
) -> tuple[str | None, dict[str, str]]:
    """The endpoint's body format and its secret settings opened, for a change that keeps them."""
    row = conn.execute("SELECT body_format FROM webhooks.endpoint_summary WHERE id = %s",
                       (endpoint_id,)).fetchone()
    stored = stored_credentials(conn, endpoint_id)
    if row is None or stored is None:
        return None, {}
    try:
        settings = keyring.open_settings(stored.secret_settings, endpoint_id, allow_plaintext=True)
    except DecryptionError as exc:
        raise InvalidEndpoint(f"secret_settings: the stored settings cannot be opened: {exc}") from None
    return str(row[0]), settings


def url_fingerprints(conn: psycopg.Connection, keyring: Keyring, batch_size: int = 500) -> dict[int, str]:
    """Each endpoint's URL fingerprint (Keyring.fingerprint), or '?' where the URL cannot be opened."""
    fingerprints: dict[int, str] = {}
    after = 0
    while True:
        # A plain read (the operator CLI runs as the schema owner): endpoint_credentials() would lock
        # the rows, and a listing must not hold up a worker disabling an endpoint.
        rows = conn.execute(
            "SELECT id, url FROM webhooks.endpoints WHERE id > %s ORDER BY id LIMIT %s", (after, batch_size)
        ).fetchall()
        for endpoint_id, url in rows:
            try:
                fingerprints[endpoint_id] = keyring.fingerprint(
                    keyring.open(url, encryption.URL, endpoint_id, allow_plaintext=True))
            except DecryptionError:
                fingerprints[endpoint_id] = "?"
        if len(rows) < batch_size:
            return fingerprints
        after = rows[-1][0]


def update_endpoint(
    conn: psycopg.Connection, endpoint_id: int, changes: dict[str, Any], keyring: Keyring
) -> None:
    """Apply changes (webhooks.update_endpoint's fields); a new URL, headers or secret settings are
    sealed bound to the endpoint, and headers are checked against the URL they will go with."""
    changes = dict(changes)
    with conn.transaction():
        if changes.get("url") is not None or changes.get("headers") is not None:
            _check_url_and_headers(conn, endpoint_id, changes, keyring)
        if changes.get("url") is not None:
            changes["url"] = keyring.seal(changes["url"], encryption.URL, endpoint_id)
        if changes.get("secret_settings") is not None:
            changes["secret_settings"] = keyring.seal_settings(changes["secret_settings"], endpoint_id)
        if changes.get("headers") is not None:
            changes["headers"] = keyring.seal_headers(changes["headers"], endpoint_id)
        conn.execute("SELECT webhooks.update_endpoint(%s, %s)", (endpoint_id, json.dumps(changes)))


def _check_url_and_headers(
    conn: psycopg.Connection, endpoint_id: int, changes: dict[str, Any], keyring: Keyring
) -> None:
    stored = stored_credentials(conn, endpoint_id)
    if stored is None:
        return  # no such endpoint: the update changes nothing
    url = changes.get("url")
    if url is None:
        try:
            url = keyring.open(stored.url, encryption.URL, endpoint_id, allow_plaintext=True)
        except DecryptionError as exc:
            raise InvalidEndpoint(f"url: the stored URL cannot be opened: {exc}") from None
    headers = changes.get("headers")
    if headers is not None:
        problem = headers_problem(url, headers)
    elif url_has_userinfo(url) and any(name.lower() == "authorization" for name in stored.headers):
        problem = headers_problem(url, {"Authorization": "x"})
    else:
        problem = None
    if problem is not None:
        raise InvalidEndpoint(f"headers: {problem}")


def rotate_secret(
    conn: psycopg.Connection, endpoint_id: int, secret: str, old_expire_at: datetime | None, keyring: Keyring,
    decided_by: str = "operator",
) -> int:
    """Sign with `secret` from now on, the earlier secrets until `old_expire_at`; the rotation is an
    endpoint event naming `decided_by` (webhooks.rotate_secret()). The secrets in use, 0: no such
    endpoint for the caller."""
    sealed = keyring.seal(secret, encryption.SIGNING_SECRET, endpoint_id)
    row = conn.execute("SELECT webhooks.rotate_secret(%s, %s, %s, %s)",
                       (endpoint_id, sealed, old_expire_at, decided_by)).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


def credential_keys(conn: psycopg.Connection) -> dict[str, int]:
    return {str(k): int(n) for k, n in conn.execute("SELECT * FROM webhooks.credential_keys()").fetchall()}


def unbound_credentials(conn: psycopg.Connection, keyring: Keyring, batch_size: int = 500) -> int:
    """How many stored credentials are not sealed bound to their endpoint (plaintext, sealed before
    binding, or not opening with these keys): what `keys rotate` would still change or cannot."""
    count, after = 0, 0
    while True:
        # A plain read, like url_fingerprints: a status query must not lock endpoints.
        rows = conn.execute(
            "SELECT id, url, signing_secrets, secret_settings, headers FROM webhooks.endpoints"
            " WHERE id > %s ORDER BY id LIMIT %s", (after, batch_size)
        ).fetchall()
        for endpoint_id, url, stored_secrets, settings, headers in rows:
            values = [(url, encryption.URL)]
            values += [(entry["secret"], encryption.SIGNING_SECRET) for entry in stored_secrets]
            values += [(str(v), encryption.setting(name)) for name, v in settings.items()]
            values += [(str(v), encryption.header(name)) for name, v in headers.items()]
            count += sum(not keyring.is_bound(value, purpose, endpoint_id) for value, purpose in values)
        if len(rows) < batch_size:
            return count
        after = rows[-1][0]


def reseal_credentials(conn: psycopg.Connection, keyring: Keyring, batch_size: int = 100) -> int:
    """Re-seal every endpoint's credentials under the keyring's primary key, bound to their endpoint
    (sealing any stored in plaintext, binding any sealed before binding existed), one committed batch
    of endpoints at a time; returns how many endpoints changed."""
    changed, after = 0, 0
    while True:
        with conn.transaction():
            rows = conn.execute(
                "SELECT * FROM webhooks.endpoint_credentials(%s, %s)", (after, batch_size)
            ).fetchall()
            for endpoint_id, url, stored_secrets, settings, headers in rows:
                new_url = keyring.reseal(url, encryption.URL, endpoint_id)
                new_secrets = [
                    {**entry,
                     "secret": keyring.reseal(entry["secret"], encryption.SIGNING_SECRET, endpoint_id)}
                    for entry in stored_secrets
                ]
                new_settings = {
                    name: keyring.reseal(str(value), encryption.setting(name), endpoint_id)
                    for name, value in settings.items()
                }
                new_headers = {
                    name: keyring.reseal(str(value), encryption.header(name), endpoint_id)
                    for name, value in headers.items()
                }
                new = (new_url, new_secrets, new_settings, new_headers)
                if new != (url, stored_secrets, settings, headers):
                    conn.execute(
                        "SELECT webhooks.store_endpoint_credentials(%s, %s, %s, %s, %s)",
                        (endpoint_id, new_url, json.dumps(new_secrets), json.dumps(new_settings),
                         json.dumps(new_headers)),
                    )
                    changed += 1
        if len(rows) < batch_size:
            return changed
        after = rows[-1][0]


def enqueue_one(
    conn: psycopg.Connection, endpoint_id: int, event_type: str, payload: str, key: str | None
) -> int:
    row = conn.execute(
        "SELECT webhooks.enqueue(%s, %s, %s::jsonb, %s)", (endpoint_id, event_type, payload, key)
    ).fetchone()
    assert row is not None
    return int(row[0])


def scope_to_tenant(conn: psycopg.Connection, tenant: str) -> None:
    """Keep this session to one tenant, as a scoped API token is kept: the views and
    replay_dead_letters() then see only its rows. An unknown name raises NoDataFound."""
    conn.execute("SELECT set_config('webhooks.tenant', webhooks.tenant_id(%s)::text, false)", (tenant,))


def queue_status(conn: psycopg.Connection) -> dict[str, Any]:
    return {
        "queue": fetch_dicts(conn, "SELECT * FROM webhooks.queue_statistics ORDER BY status"),
        "held_back": fetch_dicts(
            conn,
            "SELECT reason, sum(rows)::bigint AS rows FROM webhooks.held_back"
            " WHERE reason IS NOT NULL GROUP BY reason ORDER BY reason",
        ),
        "endpoints": fetch_dicts(
            conn,
            "SELECT id, name, active, health_status, circuit_state,"
            " consecutive_failures, last_success_at, last_failure_at"
            " FROM webhooks.endpoint_summary ORDER BY id",
        ),
    }


def find_deliveries(
    conn: psycopg.Connection, delivery_id: int | None, key: str | None
) -> list[dict[str, Any]]:
    if delivery_id is not None:
        rows = fetch_dicts(conn, "SELECT * FROM webhooks.delivery(%s)", (delivery_id,))
    else:
        rows = fetch_dicts(conn, "SELECT * FROM webhooks.delivery_by_key(%s)", (key,))
    for row in rows:
        row["history"] = fetch_dicts(
            conn,
            "SELECT attempt, outcome, failure_category, http_status, latency_ms, error, worker_id,"
            " stale, logged_at, digest_id,"
            # members only ever leave a digest: the rows it carried when it was first sent
            " (SELECT count(DISTINCT d.delivery_id) FROM webhooks.alert_delivery_log d"
            "  WHERE d.digest_id = h.digest_id) AS digest_rows"
            " FROM webhooks.delivery_history(%s) h",
            (row["delivery_id"],),
        )
    return rows


# The dead letters an operator's filter names, in webhooks.delivery_overview: the CLI's, the API's and
# the console's lists read the same rows (parameters webhook_id, event_type, category, since, until;
# each NULL matches all).
DEAD_LETTERS_MATCHING = (
    " WHERE status = 'dead_letter'"
    " AND (%(webhook_id)s::bigint IS NULL OR webhook_id = %(webhook_id)s)"
    " AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s)"
    " AND (%(category)s::text IS NULL OR failure_category = %(category)s)"
    " AND (%(since)s::timestamptz IS NULL OR dead_lettered_at >= %(since)s)"
    " AND (%(until)s::timestamptz IS NULL OR dead_lettered_at < %(until)s)"
)
# Oldest first, the order they are replayed in: the CLI, the API and the console list them so.
DEAD_LETTER_ORDER = " ORDER BY dead_lettered_at, delivery_id"


def dead_letters(conn: psycopg.Connection, filters: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    return fetch_dicts(
        conn,
        "SELECT delivery_id, webhook_id AS endpoint_id, endpoint_name, endpoint_deleted_at, event_type,"
        " attempts, failure_category, last_http_status, dead_letter_reason, dead_lettered_at"
        " FROM webhooks.delivery_overview"
        + DEAD_LETTERS_MATCHING + DEAD_LETTER_ORDER +
        " LIMIT %(limit)s",
        {**filters, "limit": limit},  # type: ignore[arg-type]
    )


def replay_one(conn: psycopg.Connection, delivery_id: int) -> bool:
    row = conn.execute("SELECT webhooks.replay(%s)", (delivery_id,)).fetchone()
    return bool(row and row[0])


def replay_refusal(conn: psycopg.Connection, delivery_id: int) -> str | None:
    """Why a delivery is not replayed, in words (None: it can be, or the caller does not see it)."""
    row = conn.execute("SELECT webhooks.replay_refusal(%s)", (delivery_id,)).fetchone()
    return None if row is None else row[0]


def started_before(conn: psycopg.Connection, until: datetime | None) -> datetime:
    """The bound of a bulk replay starting now: the given `until`, or now (database time) if sooner."""
    row = conn.execute("SELECT least(%s::timestamptz, statement_timestamp())", (until,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def bulk_operations(conn: psycopg.Connection, limit: int) -> list[dict[str, Any]]:
    return fetch_dicts(
        conn, "SELECT id, kind, status, processed, max_rows, rate, requested_by, cancelled_by, created_at,"
              " finished_at FROM webhooks.api_operations ORDER BY id DESC LIMIT %s", (limit,))


def cancel_operation(conn: psycopg.Connection, operation_id: int, cancelled_by: str) -> str | None:
    """Stop a running operation; its status after ('cancelled' once stopped), None if there is none."""
    row = conn.execute("SELECT webhooks.api_cancel_operation(%s, %s)",
                       (operation_id, cancelled_by)).fetchone()
    return None if row is None else row[0]


def replay_batch(conn: psycopg.Connection, filters: dict[str, Any], limit: int) -> int:
    row = conn.execute(
        "SELECT webhooks.replay_dead_letters(%(webhook_id)s, %(event_type)s, %(category)s, %(since)s,"
        " %(until)s, %(limit)s)",
        {**filters, "limit": limit},
    ).fetchone()
    return 0 if row is None else int(row[0])


# The global defaults an operator may change with `config set`, and their SQL types.
SETTABLE = {
    "max_attempts": "integer",
    "retry_schedule": "jsonb",
    "retry_jitter": "real",
    "max_deferrals": "integer",
    "timeout_ms": "integer",
    "lease_seconds": "integer",
    "claim_batch_size": "integer",
    "finish_batch_size": "integer",
    "notify_enabled": "boolean",
    "delivered_retention": "interval",
    "log_retention": "interval",
    "rate_limit_per_second": "numeric",
    "rate_limit_burst": "integer",
    "max_in_flight": "integer",
    "circuit_failure_ratio": "real",
    "circuit_window_seconds": "integer",
    "circuit_min_attempts": "integer",
    "circuit_sleep_seconds": "integer",
    "circuit_max_sleep_seconds": "integer",
    "circuit_probes": "integer",
    "circuit_probe_success_ratio": "real",
    "disable_after": "interval",
}


@dataclass(frozen=True)
class SettingMinimum:
    """A setting the database refuses below a bound (a CHECK constraint of webhooks.delivery_config),
    and why: the API checks the same bound first, and tests/integration/test_setting_bounds.py
    compares this with the constraint."""

    minimum: timedelta
    constraint: str
    reason: str


SETTING_MINIMUMS = {
    "log_retention": SettingMinimum(
        timedelta(days=1), "log_retention_at_least_a_day",
        "must be at least 1 day: the audit log is kept in daily partitions and dropped a whole day at a "
        "time"),
}


def setting_refusal(exc: psycopg.Error) -> str:
    """Why the database refused a setting: a bound's reason, else the first line of its message."""
    for rule in SETTING_MINIMUMS.values():
        if exc.diag.constraint_name == rule.constraint:
            return rule.reason
    return (exc.diag.message_primary or type(exc).__name__).splitlines()[0]


def show_config(conn: psycopg.Connection) -> dict[str, Any]:
    [row] = fetch_dicts(conn, "SELECT * FROM webhooks.delivery_config")
    row.pop("singleton", None)
    return row


PURGE_BATCH_ROWS = 10_000


def set_config(conn: psycopg.Connection, key: str, value: str | None) -> None:
    sql_type = SETTABLE[key]
    statement = psycopg.sql.SQL(
        "UPDATE webhooks.delivery_config SET {key} = %s::{type}, updated_at = now()"
    ).format(key=psycopg.sql.Identifier(key), type=psycopg.sql.SQL(sql_type))
    conn.execute(statement, (value,))


def purge(
    conn: psycopg.Connection, dead_letters_older_than: str | None, webhook_id: int | None
) -> dict[str, int]:
    """Retention now, in batches of PURGE_BATCH_ROWS (each its own transaction: the connection is in
    autocommit) until a batch finds less than a full one of each kind; then dead letters if asked."""
    row = {"delivered_rows": 0, "log_partitions": 0, "log_rows": 0}
    while True:
        [batch] = fetch_dicts(conn, "SELECT * FROM webhooks.purge(%s)", (PURGE_BATCH_ROWS,))
        row = {key: row[key] + int(batch[key]) for key in row}
        if batch["delivered_rows"] < PURGE_BATCH_ROWS and batch["log_rows"] < PURGE_BATCH_ROWS:
            break
    if dead_letters_older_than is not None:
        dead = conn.execute(
            "SELECT webhooks.purge_dead_letters(%s::interval, %s)", (dead_letters_older_than, webhook_id)
        ).fetchone()
        row["dead_letters"] = 0 if dead is None else int(dead[0])
    return row


# --- The demo ------------------------------------------------------------------------------------


def insert_sample_alerts(
    conn: psycopg.Connection, endpoint_id: int, count: int, severities: Sequence[str]
) -> list[int]:
    """Queue sample alerts with a plain INSERT, as any application may (three severities in turn);
    their delivery ids."""
    rows = conn.execute(
        "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, source_ref)"
        " SELECT %s, 'alert.created',"
        "        jsonb_build_object('alert_id', n, 'title', 'Disk almost full on db-' || n,"
        "                           'severity', (%s::text[])[1 + n %% 3]),"
        "        'alerts:' || n"
        " FROM generate_series(1, %s) AS n RETURNING delivery_id",
        (endpoint_id, list(severities), count),
    ).fetchall()
    return [int(row[0]) for row in rows]


def final_counts(conn: psycopg.Connection, delivery_ids: Sequence[int]) -> dict[str, int]:
    """How many of these deliveries ended ('final': delivered or dead letter), and were delivered."""
    [row] = fetch_dicts(
        conn,
        "SELECT count(*) FILTER (WHERE status IN ('delivered', 'dead_letter')) AS final,"
        " count(*) FILTER (WHERE status = 'delivered') AS delivered"
        " FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s)",
        (list(delivery_ids),),
    )
    return {name: int(value) for name, value in row.items()}


def demo_report(
    conn: psycopg.Connection, delivery_ids: Sequence[int], endpoint_id: int
) -> list[tuple[str, list[str], list[tuple[Any, ...]]]]:
    """The demo's deliveries as the tables hold them: queue rows, audit rows, the endpoint's health."""
    ids = list(delivery_ids)
    queries = (
        ("webhooks.alert_delivery_queue",
         "SELECT delivery_id, status, attempts, event_type, idempotency_key, delivered_at"
         " FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s) ORDER BY 1", ids),
        ("webhooks.alert_delivery_log (the audit log)",
         "SELECT delivery_id, attempt, outcome, failure_category, http_status, latency_ms,"
         " worker_id FROM webhooks.alert_delivery_log WHERE delivery_id = ANY(%s)"
         " ORDER BY log_id", ids),
        ("webhooks.webhook_health_metrics",
         "SELECT webhook_id, total_attempts, successes, failures, health_status,"
         " round(avg_latency_ms::numeric, 1) AS avg_latency_ms"
         " FROM webhooks.webhook_health_metrics WHERE webhook_id = %s", endpoint_id),
    )
    report = []
    for title, query, param in queries:
        cur = conn.execute(query, (param,))
        report.append((title, [d.name for d in cur.description or []], cur.fetchall()))
    return report
