"""The worker's queue: its connection pool, and every call the worker makes into webhooks.* SQL."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import orjson
import psycopg
from psycopg.rows import class_row, dict_row
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool

from worker import encryption
from worker.encryption import DecryptionError, Keyring, UnsealedValue
from worker.rules.classification import RetryPolicy, RetrySchedule
from worker.rules.model import Claimed, Finished, FinishResult
from worker.rules.registration import sendable_headers

APPLICATION_NAME = "webhook-worker"
NOTIFY_CHANNEL = "webhooks_queue"
RECONNECT_GIVE_UP_SECONDS = 8.0
# Detect a silently dropped connection (no RST) within about a minute.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
# The liveness connection, on both ends: a worker whose host vanishes without closing it (a node
# failure) is seen dead by PostgreSQL, which then drops its lock, within about 11 s rather than the
# operating system's two hours; and the worker notices as soon as the server does.
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


def outcomes_document(outcomes: Sequence[Finished]) -> str:
    """The JSON array webhooks.finish() takes: one object per outcome, its fields by name."""
    try:
        # orjson writes dataclasses and UUIDs itself, at about a fifteenth of the standard
        # library's cost: this runs once per attempt.
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
class Purged:
    """What one webhooks.purge() batch removed."""

    delivered_rows: int
    log_partitions: int
    log_rows: int


@dataclass(frozen=True)
class WorkerIdHold:
    """What webhooks.register_worker() said: whether this process now holds its worker id (the
    session advisory lock of its liveness row), or who does."""

    held: bool
    holder_pid: int | None
    holder_since: datetime | None
    reclaimed: int  # rows an earlier, dead process under the same id had in flight


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


# Keys url_version's digests: a URL stored in plaintext, digested without a key, could be found by
# digesting guesses (the reason URL fingerprints are keyed too).
_URL_VERSION_KEY = os.urandom(32)


def url_version(stored_url: str) -> str:
    """Changes whenever the endpoint's URL does and opens nothing: a keyed digest of the URL as
    stored (sealed with a fresh nonce each time it is set, or plaintext)."""
    return hashlib.blake2b(stored_url.encode(), digest_size=16, key=_URL_VERSION_KEY).hexdigest()


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
        "url_version": url_version(row["endpoint_url"]),
    }


_ABSENT = object()


# A claimed row's identity: each Claimed field and the column of acquire()'s answer it comes from.
_IDENTITY = (("delivery_id", "delivery_id"), ("endpoint_id", "webhook_id"), ("event_id", "event_id"),
             ("idempotency_key", "idempotency_key"), ("event_type", "event_type"), ("attempt", "attempt"),
             ("max_attempts", "max_attempts"), ("lease_token", "lease_token"),
             ("locked_until", "locked_until"))


def _claimed(row: dict[str, Any], keyring: Keyring, endpoints: dict[int, dict[str, Any] | str],
             require_sealed: bool = True) -> Claimed:
    """A claimed row; if its endpoint's settings cannot be read, a row carrying the problem instead
    (it then fails alone as `internal`, without a request). `endpoints` memoises per batch."""
    identity = {field: row[column] for field, column in _IDENTITY}
    identity["digest_id"] = row.get("digest_id")
    # (absent from a schema whose acquire() predates the tenant label: every row is `default`'s)
    identity["tenant"] = row.get("tenant") or "default"
    identity["tenant_rank"] = row.get("tenant_rank") or 1
    # (absent from a schema whose acquire() predates tenants' networks: the operator's rules apply,
    # as they did then, until `migrate` runs)
    networks = row.get("tenant_networks", _ABSENT)
    identity["tenant_networks"] = None if networks is _ABSENT else tuple(networks or ())
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
        # worker.tenants / worker.exclude_tenants: the tenants this process's pool serves
        self.pool_tenants: tuple[list[str] | None, list[str] | None] = (None, None)

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

    async def server_encoding(self) -> str | None:
        """The database's encoding, as PostgreSQL reported it when the connection opened."""
        async with self.pool.connection() as conn:
            return conn.info.parameter_status("server_encoding")

    async def settings(self) -> DeliverySettings:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT * FROM webhooks.worker_settings()")
            row = await cur.fetchone()
        if row is None:
            raise RuntimeError("webhooks.delivery_config has no row: run `webhook-worker migrate`")
        return DeliverySettings(
            max_attempts=row["max_attempts"], timeout_seconds=row["timeout_ms"] / 1000.0,
            lease_seconds=row["lease_seconds"], claim_batch_size=row["claim_batch_size"],
            finish_batch_size=row["finish_batch_size"], notify_enabled=row["notify_enabled"])

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

    # --- Liveness: one connection per process, held for its whole life -------------------------

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

    async def register_worker(
        self, conn: psycopg.AsyncConnection[Any], worker_id: str, instance: UUID
    ) -> WorkerIdHold:
        cur = conn.cursor(row_factory=dict_row)
        if self.pool_tenants == (None, None):  # the call a schema before tenants (4) also has
            await cur.execute("SELECT * FROM webhooks.register_worker(%s, %s)", (worker_id, instance))
        else:
            await cur.execute("SELECT * FROM webhooks.register_worker(%s, %s, %s, %s)",
                              (worker_id, instance, *self.pool_tenants))
        row = await cur.fetchone()
        assert row is not None
        return WorkerIdHold(held=bool(row["registered"]), holder_pid=row["holder_pid"],
                            holder_since=row["holder_since"], reclaimed=int(row["reclaimed"] or 0))

    @staticmethod
    async def release_unheld_leases(conn: psycopg.AsyncConnection[Any], worker_id: str,
                                    held: Collection[UUID]) -> int:
        """Give back every row leased under worker_id but not in `held`, on the connection that has
        just registered it again (sql/functions/liveness.sql)."""
        cur = await conn.execute("SELECT webhooks.release_unheld_leases(%s, %s)", (worker_id, list(held)))
        row = await cur.fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    async def reclaim_lost_workers(conn: psycopg.AsyncConnection[Any], grace_seconds: float) -> int:
        """Reclaim the rows of workers whose session ended (sql/functions/liveness.sql)."""
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
            # without a pool, the call a schema before tenants (4) also has
            if self.pool_tenants == (None, None):
                cur = await conn.execute("SELECT webhooks.next_due_in()")
            else:
                cur = await conn.execute("SELECT webhooks.next_due_in(%s, %s)", self.pool_tenants)
            row = await cur.fetchone()
        return None if row is None else row[0]

    async def acquire(self, worker_id: str, batch_size: int, lease_seconds: int) -> list[Claimed]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            # The endpoint's JSON columns arrive on every row; keep them as text, and parse them
            # once per endpoint in _endpoint_settings.
            cur.adapters.register_loader("jsonb", TextLoader)
            if self.pool_tenants == (None, None):
                await cur.execute(
                    "SELECT * FROM webhooks.acquire(%s, %s, %s)", (worker_id, batch_size, lease_seconds)
                )
            else:
                await cur.execute("SELECT * FROM webhooks.acquire(%s, %s, %s, %s, %s)",
                                  (worker_id, batch_size, lease_seconds, *self.pool_tenants))
            rows = await cur.fetchall()
        endpoints: dict[int, dict[str, Any] | str] = {}
        return [_claimed(row, self.keyring, endpoints, self.require_sealed) for row in rows]

    async def finish(self, worker_id: str, outcomes: Sequence[Finished]) -> list[FinishResult]:
        payload = outcomes_document(outcomes)
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(FinishResult))
            await cur.execute("SELECT * FROM webhooks.finish(%s, %s)", (worker_id, payload))
            return await cur.fetchall()

    async def housekeeping(self) -> dict[str, int]:
        """Dead-letter disabled endpoints' rows past their retry window and keep log partitions
        ahead (retention is purge(), called apart)."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT webhooks.expire_disabled_endpoint_rows() AS expired_rows,"
                " webhooks.ensure_log_partitions() AS partitions_created"
            )
            row = await cur.fetchone()
        return {name: int(value or 0) for name, value in (row or {}).items()}

    async def purge(self, batch_size: int) -> Purged:
        """One batch of retention, one transaction (the pool's connections commit each statement)."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(Purged))
            await cur.execute("SELECT * FROM webhooks.purge(%s)", (batch_size,))
            row = await cur.fetchone()
        return row or Purged(0, 0, 0)

    async def release(self, worker_id: str, rows: Sequence[Claimed]) -> int:
        """Give back rows claimed but not delivered (shutdown): their attempt is not counted."""
        leases = json.dumps([{"delivery_id": r.delivery_id, "lease_token": str(r.lease_token)} for r in rows])
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT webhooks.release(%s, %s)", (worker_id, leases))
            row = await cur.fetchone()
        return 0 if row is None else int(row[0])
