"""/v1/stats and /v1/config: the queue by status and what is held back, and the fleet-wide defaults,
read and changed (each setting's bounds as the database's CHECK constraints hold them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import orjson
import psycopg
from aiohttp import web
from pydantic import AfterValidator, Field, JsonValue, create_model, field_validator

from worker.api import answers
from worker.api.common import state_of
from worker.api.declare import Route, body_of
from worker.api.inputs import (
    INTEGER_MAX,
    Body,
)
from worker.config import MAX_LEASE_SECONDS
from worker.observability import get_logger
from worker.rules.classification import RetrySchedule
from worker.rules.shapes import json_default
from worker.store import deliveries as delivery_store
from worker.store import settings as setting_store
from worker.web.context import (
    FLEET_ADMIN,
    FLEET_READ,
    READ,
    caller_of,
    json_response,
)
from worker.web.problems import invalid


async def stats(request: web.Request) -> web.Response:
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        return json_response(await delivery_store.statistics(conn))


async def get_config(request: web.Request) -> web.Response:
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        return json_response(await setting_store.read(conn))


# A real setting (a ratio, the jitter) is stored rounded to this many decimals: a value too small
# for PostgreSQL's real (5e-324) would be refused by the database as out of range.
REAL_DIGITS = 6


# The bounds of each setting, as webhooks.delivery_config's CHECK constraints hold them; the rules over
# several settings (lease_outlasts_timeout) and an interval's syntax are the database's to refuse.
SETTING_BOUNDS: dict[str, dict[str, float]] = {
    "max_attempts": {"ge": 1, "le": 100},
    "retry_jitter": {"ge": 0, "le": 1},  # stored rounded to REAL_DIGITS, as the other reals
    "max_deferrals": {"ge": 0, "le": INTEGER_MAX},
    "timeout_ms": {"ge": 100, "le": 300_000},
    "lease_seconds": {"ge": 1, "le": MAX_LEASE_SECONDS},
    "claim_batch_size": {"ge": 1, "le": 10_000},
    "finish_batch_size": {"ge": 1, "le": 10_000},
    "rate_limit_per_second": {"gt": 0},
    "rate_limit_burst": {"ge": 1, "le": INTEGER_MAX},
    "max_in_flight": {"ge": 1, "le": INTEGER_MAX},
    "circuit_failure_ratio": {"ge": 10**-REAL_DIGITS, "le": 1},
    "circuit_window_seconds": {"ge": 1, "le": INTEGER_MAX},
    "circuit_min_attempts": {"ge": 1, "le": INTEGER_MAX},
    "circuit_sleep_seconds": {"ge": 1, "le": INTEGER_MAX},
    "circuit_max_sleep_seconds": {"ge": 1, "le": INTEGER_MAX},
    "circuit_probes": {"ge": 1, "le": INTEGER_MAX},
    "circuit_probe_success_ratio": {"ge": 10**-REAL_DIGITS, "le": 1},
}


# settings that may be cleared (null): the others are NOT NULL
NULLABLE_SETTINGS = {"rate_limit_per_second", "rate_limit_burst"}


SQL_TYPES: dict[str, Any] = {"integer": int, "real": float, "numeric": float, "boolean": bool,
                             "interval": str, "jsonb": JsonValue}


def _setting_field(key: str, sql_type: str) -> Any:
    kind: Any = SQL_TYPES[sql_type]
    bounds: dict[str, Any] = SETTING_BOUNDS.get(key, {})
    annotated: Any = Annotated[kind, Field(**bounds)]
    if sql_type == "interval":
        seconds: Any = Annotated[float, Field(ge=0, description="seconds")]
        minimum = setting_store.SETTING_MINIMUMS.get(key)
        if minimum is not None:
            # the bound documented, and checked with its reason (an interval's text: by the database)
            least = minimum.minimum.total_seconds()
            seconds = Annotated[float, Field(description="seconds", json_schema_extra={"minimum": least}),
                                AfterValidator(_at_least(least, minimum.reason))]
        annotated = seconds | Annotated[
            str, Field(min_length=1, description="a PostgreSQL interval such as '7 days'")]
    if key in NULLABLE_SETTINGS:
        annotated = annotated | None
    return (annotated, None)


def _at_least(least: float, reason: str) -> Callable[[float], float]:
    def check(value: float) -> float:
        if value < least:
            raise ValueError(reason)
        return value
    return check


def _retry_schedule(value: Any) -> Any:
    if value is not None:
        try:
            RetrySchedule.from_json(value, 0.0)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(str(exc)) from None
    return value


CONFIG_READ_ONLY = ("retry_policy", "dead_letter_alert_threshold", "max_payload_bytes", "updated_at")


_CONFIG_FIELDS: dict[str, Any] = {
    **{key: _setting_field(key, sql_type) for key, sql_type in setting_store.SETTABLE.items()},
    # read-only columns GET /v1/config answers, so that its answer can be sent back unchanged
    **{key: (Annotated[JsonValue, Field(description="read-only: accepted only unchanged")], None)
       for key in CONFIG_READ_ONLY},
}


ConfigPatch = create_model(
    "ConfigPatch",
    __base__=Body,
    __doc__="settings to change, as `webhook-worker config set` names them",
    __validators__={"retry_schedule": field_validator("retry_schedule")(_retry_schedule)},
    **_CONFIG_FIELDS,
)


ConfigPatch.model_config["json_schema_extra"] = {"minProperties": 1}
ConfigPatch.model_rebuild(force=True)


async def patch_config(request: web.Request) -> web.Response:
    body = body_of(request, ConfigPatch)
    given = body.model_fields_set
    if not given:
        raise invalid("(body)", "nothing to change: give at least one setting")
    read_only = given - set(setting_store.SETTABLE)
    if read_only:
        # what GET answers can be sent back: a column no setting changes is ignored when unchanged
        async with state_of(request).db.transaction(caller_of(request)) as conn:
            current = orjson.loads(orjson.dumps(await setting_store.read(conn), default=json_default))
        for key in sorted(read_only):
            if current.get(key) != getattr(body, key):
                raise invalid(key, "read-only")
    changes = {key: _setting_text(setting_store.SETTABLE[key], getattr(body, key))
               for key in given - read_only}
    try:
        async with state_of(request).db.transaction(caller_of(request)) as conn:
            await setting_store.change(conn, changes)
            settings = await setting_store.read(conn)
    except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
        message = setting_store.setting_refusal(exc)
        # the setting named by the refusal, or the only one given; a rule over several names them all
        named = exc.diag.column_name or exc.diag.constraint_name or ""
        field = next((key for key in changes if key in named), None)
        if field is None:
            field = next(iter(changes)) if len(changes) == 1 else "(body)"
        raise invalid(field, message) from None
    get_logger().info("api changed settings", keys=sorted(changes), by=caller_of(request).name)
    return json_response(settings)


def _setting_text(sql_type: str, value: Any) -> str | None:
    """A setting's value as the text its SQL type reads (its JSON type was checked by ConfigPatch)."""
    if value is None:
        return None
    if sql_type == "jsonb":
        return orjson.dumps(value).decode()
    if sql_type == "boolean":
        return "true" if value else "false"
    if sql_type == "interval":
        # seconds, as the setting reads; an interval's text ('7 days') is accepted too
        return value if isinstance(value, str) else f"{value} seconds"
    if sql_type == "real":
        return str(round(value, REAL_DIGITS))
    return str(value)


ROUTES: list[Route] = [
    Route("GET", "/v1/stats", stats, "Queue by status, oldest due, rows held back and why", READ,
          {200: answers.Stats}),
    Route("GET", "/v1/config", get_config, "The fleet-wide defaults", FLEET_READ, {200: answers.Settings}),
    Route("PATCH", "/v1/config", patch_config, "Change fleet-wide defaults (workers pick them up)",
          FLEET_ADMIN,
          {200: answers.Settings}, body=ConfigPatch),
]
