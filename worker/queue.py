"""The database side: the connection pool and every call into the webhooks.* SQL functions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson
import psycopg
import psycopg.sql
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool

from worker import encryption
from worker.encryption import DecryptionError, Keyring, UnsealedValue
from worker.policy import RetryPolicy, RetrySchedule
from worker.registration import headers_problem, sendable_headers, url_has_userinfo

APPLICATION_NAME = "webhook-worker"
NOTIFY_CHANNEL = "webhooks_queue"
RECONNECT_GIVE_UP_SECONDS = 8.0
# Detect a silently dropped connection (no RST) within about a minute.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
# The liveness connection, on both ends: a worker whose host vanishes without closing it (a node
# failure) is seen dead by PostgreSQL, which then drops its lock, within about 11 s rather than the
# operating system's two hours; and the worker notices as soon as the server does (issue 18).
LIVENESS_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
                       "tcp_user_timeout": 11_000}
LIVENESS_SERVER_SETTINGS = {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2",
                            "tcp_keepalives_count": "3", "tcp_user_timeout": "11000"}


@dataclass(frozen=True)
class DeliverySettings:
    """The fleet-wide defaults in webhooks.delivery_config."""

    max_attempts: int
    timeout_seconds: float
    lease_seconds: int
    claim_batch_size: int
    finish_batch_size: int
    notify_enabled: bool


@dataclass(frozen=True)
class Claimed:
    """A delivery claimed under a lease, with what the request needs from its endpoint."""

    delivery_id: int
    webhook_id: int
    event_id: str
    idempotency_key: str
    event_type: str
    body: bytes
    attempt: int
    max_attempts: int
    lease_token: UUID
    locked_until: datetime
    url: str = field(repr=False)
    signing_secrets: tuple[str, ...] = field(repr=False)
    headers: dict[str, str]
    timeout_seconds: float | None  # the endpoint's own; None means the worker's default
    schedule: RetrySchedule
    traceparent: str | None = None
    # Set when the row's endpoint settings could not be read: the attempt fails as `internal`
    # without a request, and the rest of the batch is unaffected.
    problem: str | None = None
    body_format: str = "raw"
    secret_settings: dict[str, Any] = field(default_factory=dict, repr=False)
    created_at: datetime | None = None
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    # The digest (one request for several rows, issue 23) this row goes in; None: its own request.
    digest_id: int | None = None


@dataclass(frozen=True)
class Finished:
    """One attempt's outcome, as webhooks.finish() takes it."""

    delivery_id: int
    lease_token: UUID
    attempt: int
    outcome: str
    retry_after_s: float | None = None
    http_status: int | None = None
    failure_category: str | None = None
    error: str | None = None
    response_excerpt: str | None = None
    latency_ms: int | None = None
    reason: str | None = None
    disable_endpoint: bool = False


def outcomes_document(outcomes: Sequence[Finished]) -> str:
    """The JSON array webhooks.finish() takes: one object per outcome, its fields by name."""
    try:
        # orjson writes dataclasses and UUIDs itself, at about a fifteenth of the standard
        # library's cost (bench/, issue 7): this runs once per attempt.
        return orjson.dumps(outcomes).decode()
    except orjson.JSONEncodeError:
        # A string orjson refuses (a lone surrogate in an error text): the standard library escapes
        # it, the database then refuses that outcome alone, and Worker._write isolates it.
        return json.dumps([
            {f.name: str(o.lease_token) if f.name == "lease_token" else getattr(o, f.name)
             for f in fields(Finished)}
            for o in outcomes
        ])


@dataclass(frozen=True)
class Registration:
    """What webhooks.register_worker() said: registered, or who holds the worker id."""

    registered: bool
    holder_pid: int | None
    holder_since: datetime | None
    reclaimed: int  # rows an earlier, dead process under the same id had in flight


@dataclass(frozen=True)
class FinishResult:
    delivery_id: int
    applied: bool
    status: str
    endpoint_change: str | None  # e.g. "circuit_opened: 12 of 20 attempts failed in the last 60 s"


def active_secrets(stored: Sequence[dict[str, Any]], now: datetime | None = None) -> tuple[str, ...]:
    """The endpoint's secrets that have not expired (rotation keeps old ones until their expiry)."""
    now = now or datetime.now(UTC)
    result = []
    for entry in stored:
        expires = entry.get("expires_at")
        if expires is not None:
            when = datetime.fromisoformat(expires)
            if (when if when.tzinfo else when.replace(tzinfo=UTC)) <= now:
                continue
        result.append(entry["secret"])
    return tuple(result)


def _endpoint_settings(row: dict[str, Any], keyring: Keyring, require_sealed: bool) -> dict[str, Any]:
    """What a claimed row's request needs from its endpoint: the same for every row of the endpoint
    in a batch, so it is opened and parsed once per endpoint, not once per row. The JSON columns
    arrive as text (see Queue.acquire). Each credential opens only on its own endpoint's row."""

    def parsed(column: str) -> Any:
        value = row[column]
        return json.loads(value) if isinstance(value, str) else value

    endpoint_id, plaintext = row["webhook_id"], not require_sealed
    return {
        "url": keyring.open(row["endpoint_url"], encryption.URL, endpoint_id, plaintext),
        "signing_secrets": tuple(
            keyring.open(s, encryption.SIGNING_SECRET, endpoint_id, plaintext)
            for s in active_secrets(parsed("signing_secrets"))
        ),
        "headers": sendable_headers(keyring.open_headers(parsed("headers"), endpoint_id, plaintext)),
        "timeout_seconds": None if row["timeout_ms"] is None else row["timeout_ms"] / 1000.0,
        "schedule": RetrySchedule.from_json(parsed("retry_schedule"), row["retry_jitter"]),
        "body_format": row["body_format"],
        "secret_settings": keyring.open_settings(parsed("secret_settings") or {}, endpoint_id, plaintext),
        "retry_policy": RetryPolicy.from_json(parsed("retry_policy")),
    }


def _claimed(row: dict[str, Any], keyring: Keyring, endpoints: dict[int, dict[str, Any] | str],
             require_sealed: bool = True) -> Claimed:
    """A claimed row; if its endpoint's settings cannot be read, a row carrying the problem instead
    (it then fails alone as `internal`, without a request). `endpoints` memoises per batch."""
    identity = {
        name: row[name]
        for name in ("delivery_id", "webhook_id", "event_id", "idempotency_key", "event_type", "attempt",
                     "max_attempts", "lease_token", "locked_until")
    }
    identity["digest_id"] = row.get("digest_id")  # absent before schema 37
    settings = endpoints.get(row["webhook_id"])
    if settings is None:
        try:
            settings = _endpoint_settings(row, keyring, require_sealed)
        except UnsealedValue as exc:
            settings = f"endpoint credentials refused: {exc}"
        except DecryptionError as exc:
            settings = f"endpoint credentials cannot be decrypted: {exc}"
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            settings = f"unusable endpoint settings: {type(exc).__name__}: {exc}"
        endpoints[row["webhook_id"]] = settings
    if isinstance(settings, str):
        return _unusable(identity, settings)
    return Claimed(**identity, **settings, body=row["payload"].encode(), traceparent=row["traceparent"],
                   created_at=row["created_at"])


def _unusable(identity: dict[str, Any], problem: str) -> Claimed:
    return Claimed(
        **identity, body=b"", url="", signing_secrets=(), headers={}, timeout_seconds=None,
        schedule=RetrySchedule(), problem=problem[:300],
    )


class Queue:
    """The worker's handle on the queue: a small pool, and one method per SQL function it calls."""

    def __init__(self, pool: AsyncConnectionPool, listen_kwargs: dict[str, Any], keyring: Keyring,
                 require_sealed: bool = True, liveness_kwargs: dict[str, Any] | None = None) -> None:
        self.pool = pool
        self._listen_kwargs = listen_kwargs
        self._liveness_kwargs = liveness_kwargs or listen_kwargs
        self.keyring = keyring
        # security.require_sealed: a credential stored in plaintext fails its delivery, not the fleet.
        self.require_sealed = require_sealed

    @classmethod
    def create(
        cls, conninfo: str, min_size: int, max_size: int, connect_timeout: float, worker_id: str,
        keyring: Keyring, require_sealed: bool = True,
    ) -> Queue:
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "application_name": f"{APPLICATION_NAME} {worker_id}"[:63],
            "connect_timeout": max(1, int(connect_timeout)),
            **KEEPALIVES,
        }
        pool = AsyncConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=connect_timeout,
            # psycopg-pool doubles its wait between reconnection attempts without a cap; giving up
            # after a few seconds starts a fresh attempt (1 s apart again) on the next request, so a
            # database that comes back after a long outage is found within seconds, not minutes.
            reconnect_timeout=RECONNECT_GIVE_UP_SECONDS,
            name="webhook-worker",
            kwargs=kwargs,
        )
        listen_kwargs = {
            **kwargs,
            "conninfo": conninfo,
            "application_name": f"{APPLICATION_NAME} {worker_id} listener"[:63],
        }
        liveness_kwargs = {
            **listen_kwargs,
            **LIVENESS_KEEPALIVES,
            "application_name": f"{APPLICATION_NAME} {worker_id} liveness"[:63],
        }
        return cls(pool, listen_kwargs, keyring, require_sealed, liveness_kwargs)

    async def open(self) -> None:
        # wait=False: the pool keeps trying in the background while the database is unreachable.
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()

    async def settings(self) -> DeliverySettings:
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT * FROM webhooks.worker_settings()")
            row = await cur.fetchone()
        if row is None:
            raise RuntimeError("webhooks.delivery_config has no row: run `webhook-worker migrate`")
        return DeliverySettings(row[0], row[1] / 1000.0, row[2], row[3], row[4], row[5])

    async def notifications(self) -> AsyncIterator[None]:
        """Yield once when listening, then once per NOTIFY; on its own connection, not the pool's.

        Raises psycopg.OperationalError when the connection is lost; the caller reconnects.
        """
        conn = await psycopg.AsyncConnection.connect(**self._listen_kwargs)
        async with conn:
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            yield None
            async for _notify in conn.notifies():
                yield None

    # --- Liveness: one connection per process, held for its whole life (issue 18) ----------------

    async def liveness_connection(self) -> psycopg.AsyncConnection[Any]:
        """A connection of its own, outside the pool: its session holds the worker id's lock."""
        conn = await psycopg.AsyncConnection.connect(**self._liveness_kwargs)
        try:
            # (ignored by PostgreSQL on a Unix-domain socket, where a peer cannot vanish unseen)
            for name, value in LIVENESS_SERVER_SETTINGS.items():
                await conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        except BaseException:
            await conn.close()
            raise
        return conn

    @staticmethod
    async def register_worker(
        conn: psycopg.AsyncConnection[Any], worker_id: str, instance: UUID
    ) -> Registration:
        cur = await conn.execute("SELECT * FROM webhooks.register_worker(%s, %s)", (worker_id, instance))
        row = await cur.fetchone()
        assert row is not None
        return Registration(bool(row[0]), row[1], row[2], int(row[3] or 0))

    @staticmethod
    async def reclaim_lost_workers(conn: psycopg.AsyncConnection[Any], grace_seconds: float) -> int:
        """Reclaim the rows of workers whose session ended (see 035_worker_liveness.sql)."""
        cur = await conn.execute("SELECT webhooks.reclaim_lost_workers(%s)", (grace_seconds,))
        row = await cur.fetchone()
        return 0 if row is None else int(row[0])

    async def schema_version(self, wait_seconds: float) -> int | None:
        async with self.pool.connection(timeout=wait_seconds) as conn:
            cur = await conn.execute("SELECT webhooks.schema_version()")
            row = await cur.fetchone()
        return None if row is None else row[0]

    async def credential_keys(self) -> dict[str, int]:
        """How many stored credentials each key id sealed ('plaintext': not sealed yet)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT key_id, credentials FROM webhooks.credential_keys()")
            return {str(k): int(n) for k, n in await cur.fetchall()}

    async def queue_stats(self, endpoint_limit: int, interval_seconds: float) -> dict[str, Any] | None:
        """Queue statistics, or None when another worker sampled them within the interval."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT webhooks.queue_stats(%s, make_interval(secs => %s))",
                (endpoint_limit, interval_seconds),
            )
            row = await cur.fetchone()
        return None if row is None else row[0]

    async def next_due_in(self) -> float | None:
        """Seconds until a row falls due or a lease expires; None when nothing waits."""
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT webhooks.next_due_in()")
            row = await cur.fetchone()
        return None if row is None else row[0]

    async def acquire(self, worker_id: str, batch_size: int, lease_seconds: int) -> list[Claimed]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            # The endpoint's JSON columns arrive on every row; keep them as text, and parse them
            # once per endpoint in _endpoint_settings.
            cur.adapters.register_loader("jsonb", TextLoader)
            await cur.execute(
                "SELECT * FROM webhooks.acquire(%s, %s, %s)", (worker_id, batch_size, lease_seconds)
            )
            rows = await cur.fetchall()
        endpoints: dict[int, dict[str, Any] | str] = {}
        return [_claimed(row, self.keyring, endpoints, self.require_sealed) for row in rows]

    async def finish(self, worker_id: str, outcomes: Sequence[Finished]) -> list[FinishResult]:
        payload = outcomes_document(outcomes)
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT * FROM webhooks.finish(%s, %s)", (worker_id, payload))
            return [FinishResult(*row) for row in await cur.fetchall()]

    async def housekeeping(self) -> dict[str, int]:
        """Dead-letter disabled endpoints' rows past their retry window, keep log partitions ahead,
        and apply retention (one bounded batch, by one worker at a time)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT webhooks.expire_disabled_endpoint_rows(), webhooks.ensure_log_partitions(),"
                " p.* FROM webhooks.purge() p"
            )
            row = await cur.fetchone()
        names = (
            "expired_rows",
            "partitions_created",
            "purged_delivered",
            "dropped_partitions",
            "purged_log_rows",
        )
        return dict(zip(names, (int(v or 0) for v in row or ()), strict=False))

    async def release(self, worker_id: str, rows: Sequence[Claimed]) -> int:
        """Give back rows claimed but not delivered (shutdown): their attempt is not counted."""
        leases = json.dumps([{"delivery_id": r.delivery_id, "lease_token": str(r.lease_token)} for r in rows])
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT webhooks.release(%s, %s)", (worker_id, leases))
            row = await cur.fetchone()
        return 0 if row is None else int(row[0])


# --- Endpoint administration (the CLI) -------------------------------------------------------


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
            " %s)",
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
    row = conn.execute(
        "SELECT * FROM webhooks.endpoint_credentials(%s, 1)", (endpoint_id - 1,)
    ).fetchone()
    if row is None or row[0] != endpoint_id:
        return None
    return StoredCredentials(row[1], row[2], row[3], row[4])


def find_endpoint(conn: psycopg.Connection, name_or_id: str) -> int | None:
    row = conn.execute(
        "SELECT id FROM webhooks.endpoints WHERE name = %s OR id::text = %s ORDER BY name = %s DESC",
        (name_or_id, name_or_id, name_or_id),
    ).fetchone()
    return None if row is None else int(row[0])


def set_endpoint_active(conn: psycopg.Connection, endpoint_id: int, active: bool, reason: str) -> str | None:
    if active:
        row = conn.execute("SELECT webhooks.enable_endpoint(%s)", (endpoint_id,)).fetchone()
    else:
        row = conn.execute("SELECT webhooks.disable_endpoint(%s, %s)", (endpoint_id, reason)).fetchone()
    return None if row is None else row[0]


def set_circuit(conn: psycopg.Connection, endpoint_id: int, action: str, until: str | None) -> str:
    row = conn.execute("SELECT webhooks.set_circuit(%s, %s, %s)", (endpoint_id, action, until)).fetchone()
    assert row is not None
    return str(row[0])


def list_endpoints(conn: psycopg.Connection) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    cur.execute("SELECT * FROM webhooks.endpoint_summary ORDER BY id")
    return cur.fetchall()


# --- Operator queries (the CLI) ---------------------------------------------------------------


def fetch_dicts(
    conn: psycopg.Connection, sql: str, params: Sequence[Any] | None = None
) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(sql, params)  # every caller passes a literal statement
    return cur.fetchall()


def show_endpoint(conn: psycopg.Connection, endpoint_id: int) -> dict[str, Any]:
    [summary] = fetch_dicts(conn, "SELECT * FROM webhooks.endpoint_summary WHERE id = %s", (endpoint_id,))
    [coalescing] = fetch_dicts(conn, "SELECT coalesce_max, coalesce_window FROM webhooks.endpoints"
                                     " WHERE id = %s", (endpoint_id,))
    summary.update(coalescing)
    summary["events"] = fetch_dicts(
        conn,
        "SELECT change, reason, decided_by, delivery_id, at FROM webhooks.endpoint_events"
        " WHERE webhook_id = %s ORDER BY at DESC LIMIT 10",
        (endpoint_id,),
    )
    summary["queued"] = dict(
        conn.execute(
            "SELECT status, count(*) FROM webhooks.alert_delivery_queue WHERE webhook_id = %s GROUP BY 1",
            (endpoint_id,),
        ).fetchall()
    )
    return summary


def endpoint_coalescing(conn: psycopg.Connection, endpoint_id: int) -> tuple[str, int | None] | None:
    """The endpoint's body format and coalesce_max (issue 23), for a change to either."""
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
    conn: psycopg.Connection, endpoint_id: int, secret: str, old_expire_at: datetime | None, keyring: Keyring
) -> int:
    row = conn.execute(
        "SELECT webhooks.rotate_secret(%s, %s, %s)",
        (endpoint_id, keyring.seal(secret, encryption.SIGNING_SECRET, endpoint_id), old_expire_at),
    ).fetchone()
    return 0 if row is None else int(row[0])


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


def dead_letters(conn: psycopg.Connection, filters: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    return fetch_dicts(
        conn,
        "SELECT delivery_id, endpoint_name, event_type, attempts, failure_category, last_http_status,"
        " dead_letter_reason, dead_lettered_at FROM webhooks.delivery_overview"
        " WHERE status = 'dead_letter'"
        " AND (%(webhook_id)s::bigint IS NULL OR webhook_id = %(webhook_id)s)"
        " AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s)"
        " AND (%(category)s::text IS NULL OR failure_category = %(category)s)"
        " AND (%(since)s::timestamptz IS NULL OR dead_lettered_at >= %(since)s)"
        " AND (%(until)s::timestamptz IS NULL OR dead_lettered_at < %(until)s)"
        " ORDER BY dead_lettered_at, delivery_id LIMIT %(limit)s",
        {**filters, "limit": limit},  # type: ignore[arg-type]
    )


def replay_one(conn: psycopg.Connection, delivery_id: int) -> bool:
    row = conn.execute("SELECT webhooks.replay(%s)", (delivery_id,)).fetchone()
    return bool(row and row[0])


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


def show_config(conn: psycopg.Connection) -> dict[str, Any]:
    [row] = fetch_dicts(conn, "SELECT * FROM webhooks.delivery_config")
    row.pop("singleton", None)
    return row


def set_config(conn: psycopg.Connection, key: str, value: str | None) -> None:
    sql_type = SETTABLE[key]
    statement = psycopg.sql.SQL(
        "UPDATE webhooks.delivery_config SET {key} = %s::{type}, updated_at = now()"
    ).format(key=psycopg.sql.Identifier(key), type=psycopg.sql.SQL(sql_type))
    conn.execute(statement, (value,))


def purge(
    conn: psycopg.Connection, dead_letters_older_than: str | None, webhook_id: int | None
) -> dict[str, int]:
    [row] = fetch_dicts(conn, "SELECT * FROM webhooks.purge(10000)")
    if dead_letters_older_than is not None:
        dead = conn.execute(
            "SELECT webhooks.purge_dead_letters(%s::interval, %s)", (dead_letters_older_than, webhook_id)
        ).fetchone()
        row["dead_letters"] = 0 if dead is None else int(dead[0])
    return row
