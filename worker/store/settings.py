"""The fleet-wide defaults as stored (webhooks.delivery_config): read, and changed by the operator
(`config set`, PATCH /v1/config), with the database's reason when it refuses a value."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from worker.store.database import Conn, fetch_one

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


async def read(conn: Conn) -> dict[str, Any]:
    """Every default, as the table holds it."""
    row = await fetch_one(conn, "SELECT * FROM webhooks.delivery_config")
    assert row is not None
    row.pop("singleton", None)
    return row


async def change(conn: Conn, changes: dict[str, str | None]) -> None:
    """Set each key to its value (a text its SQL type reads; None: NULL), in the caller's transaction."""
    for key, value in changes.items():
        statement = sql.SQL(
            "UPDATE webhooks.delivery_config SET {key} = %s::{type}, updated_at = now()"
        ).format(key=sql.Identifier(key), type=sql.SQL(SETTABLE[key]))
        await conn.execute(statement, (value,))
