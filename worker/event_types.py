"""The event-type catalogue: its rules and rows, and a payload checked against its type's JSON Schema."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from psycopg.rows import dict_row

from worker import wording

# The queue's rule for event types (constraint event_type_printable), and no '*': subscriptions use
# it as a wildcard. SQL repeats these (constraints event_type_name_form and
# event_type_description_length of webhooks.event_types).
MAX_NAME_BYTES = 256
MAX_DESCRIPTION_CHARS = 2000
# The worker's own types: catalogued by the migrations, changed by no caller.
RESERVED_PREFIX = "webhook."
# A validation message quotes the offending value, which may be large: an answer carries this much.
MAX_MESSAGE_CHARS = 300
# Compiled validators kept, by the schema's text: a publish looks its type up every time, and
# compiling a schema costs far more than checking a payload against it.
_VALIDATORS_KEPT = 256

_COLUMNS = "name, description, schema, deprecated"


class EventTypeError(ValueError):
    """A catalogue change that breaks a rule: the message names the field and the problem."""


@dataclass(frozen=True)
class EventType:
    name: str
    description: str
    schema: Any | None  # a JSON Schema (draft 2020-12): an object or a boolean; None: any payload
    deprecated: bool


@dataclass(frozen=True)
class PayloadProblem:
    """Why a payload does not follow its type's schema: where (an RFC 6901 JSON pointer into the
    payload, '' for the payload itself) and what."""

    pointer: str
    message: str

    def __str__(self) -> str:
        where = f"payload at {self.pointer}" if self.pointer else "payload"
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class PublishProblem:
    """Why a publish is refused before anything is queued: the field and the problem; for a payload,
    the pointer to the first error."""

    field: str  # "event_type" or "payload"
    message: str
    pointer: str | None = None

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def name_problem(name: str) -> str | None:
    """What is wrong with a catalogue name, or None."""
    if not name:
        return "must not be empty"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"at most {MAX_NAME_BYTES} bytes (UTF-8)"
    if any(not c.isprintable() for c in name):
        return "must be printable (no control characters)"
    if "*" in name:
        return "must not contain '*', which subscriptions use as a wildcard"
    if name.startswith(RESERVED_PREFIX):
        return f"types starting with {RESERVED_PREFIX!r} are the worker's own"
    return None


def json_pointer(path: Iterable[str | int]) -> str:
    """The RFC 6901 pointer of a path of keys and indexes ('' for the document itself)."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _short(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"


def schema_problem(schema: Any) -> str | None:
    """What is wrong with a JSON Schema (draft 2020-12), naming where in it, or None."""
    if not isinstance(schema, (dict, bool)):
        return "a JSON Schema is an object or a boolean"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        where = json_pointer(error.absolute_path)
        message = wording.schema_error(error)
        return _short(f"at {where}: {message}" if where else message)
    return None


def schema_from_text(text: str) -> Any:
    """A JSON Schema written as text (the CLI's --schema, the console's form): the JSON it holds, or
    EventTypeError naming the field when it is not JSON. upsert() checks that it is a JSON Schema."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise EventTypeError(f"schema: not JSON ({exc})") from None


@lru_cache(maxsize=_VALIDATORS_KEPT)
def _validator(schema_text: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema_text))


def payload_problem(schema: Any, payload: Any) -> PayloadProblem | None:
    """The first error of a payload against a schema (the one jsonschema's best_match ranks first:
    the deepest, most specific one), or None when it follows it. The schema is one the catalogue
    holds, checked by schema_problem() when it was stored."""
    if schema is None:
        return None
    validator = _validator(json.dumps(schema, sort_keys=True))
    error = best_match(validator.iter_errors(payload))
    if error is None:
        return None
    return PayloadProblem(json_pointer(error.absolute_path), _short(wording.schema_error(error)))


def publish_problem(event_type: str, known: EventType | None, payload: Any,
                    require_known: bool) -> PublishProblem | None:
    """Whether a publish of this type and payload may go ahead: the catalogue's entry for the type
    (None: not catalogued) and the setting api.require_known_event_types decide. A deprecated type is
    still accepted: its subscribers still receive it."""
    if known is None:
        if require_known:
            return PublishProblem("event_type", f"{wording.quoted(event_type)} is not in the event-type "
                                  "catalogue (api.require_known_event_types refuses unknown types)")
        return None
    problem = payload_problem(known.schema, payload)
    if problem is None:
        return None
    where = f"at {problem.pointer}: " if problem.pointer else ""
    of_type = f"(the schema of event type {wording.quoted(event_type)})"
    return PublishProblem("payload", f"{where}{problem.message} {of_type}", problem.pointer)


# --- The catalogue's rows (sql/functions/event_types.sql) -------------------------------------------


def from_row(row: dict[str, Any]) -> EventType:
    return EventType(str(row["name"]), str(row["description"]), row["schema"], bool(row["deprecated"]))


def get(conn: psycopg.Connection, name: str) -> EventType | None:
    row = conn.cursor(row_factory=dict_row).execute(
        f"SELECT {_COLUMNS} FROM webhooks.event_type(%s)", (name,)).fetchone()
    return None if row is None else from_row(row)


async def get_async(conn: psycopg.AsyncConnection[Any], name: str) -> EventType | None:
    """get() for the API's connections."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(f"SELECT {_COLUMNS} FROM webhooks.event_type(%s)", (name,))
    row = await cur.fetchone()
    return None if row is None else from_row(row)


_LISTING = f"SELECT {_COLUMNS} FROM webhooks.event_type_list(%s)"


def listing(conn: psycopg.Connection, include_deprecated: bool = True) -> list[EventType]:
    rows = conn.cursor(row_factory=dict_row).execute(_LISTING, (include_deprecated,)).fetchall()
    return [from_row(row) for row in rows]


async def listing_async(conn: psycopg.AsyncConnection[Any],
                        include_deprecated: bool = True) -> list[EventType]:
    """listing() for the console's connections."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(_LISTING, (include_deprecated,))
    return [from_row(row) for row in await cur.fetchall()]


def upsert(conn: psycopg.Connection, name: str, description: str = "", schema: Any | None = None,
           deprecated: bool | None = None) -> bool:
    """Add a type or replace its description and schema; whether it is new. A name, description
    or schema that breaks a rule raises EventTypeError naming the field, and nothing is written."""
    problem = name_problem(name)
    if problem is not None:
        raise EventTypeError(f"name: {problem}")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise EventTypeError(f"description: at most {MAX_DESCRIPTION_CHARS} characters")
    if schema is not None:
        problem = schema_problem(schema)
        if problem is not None:
            raise EventTypeError(f"schema: {problem}")
    row = conn.execute("SELECT webhooks.upsert_event_type(%s, %s, %s::jsonb, %s)",
                       (name, description, None if schema is None else json.dumps(schema),
                        deprecated)).fetchone()
    assert row is not None
    return bool(row[0])


def deprecate(conn: psycopg.Connection, name: str, deprecated: bool = True) -> bool:
    """Mark a type deprecated (or current again); whether it exists."""
    if name.startswith(RESERVED_PREFIX):
        raise EventTypeError(f"name: types starting with {RESERVED_PREFIX!r} are the worker's own")
    row = conn.execute("SELECT webhooks.deprecate_event_type(%s, %s)", (name, deprecated)).fetchone()
    return bool(row and row[0])


_UNMATCHED = "SELECT webhook_id, endpoint_name, pattern, problem FROM webhooks.unmatched_subscriptions()"


def unmatched_subscriptions(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Each endpoint's subscription pattern that no catalogued type matches ('unknown') or only
    deprecated ones do ('deprecated'), for the caller's tenant if it is kept to one."""
    return conn.cursor(row_factory=dict_row).execute(_UNMATCHED).fetchall()


async def unmatched_subscriptions_async(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
    """unmatched_subscriptions() for the console's connections."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(_UNMATCHED)
    return await cur.fetchall()


def unmatched_of_endpoint(rows: list[dict[str, Any]], endpoint_id: int) -> list[dict[str, Any]]:
    """One endpoint's rows of unmatched_subscriptions(): its patterns and their problem (what
    `endpoints show` and the console's endpoint page show)."""
    return [{"pattern": row["pattern"], "problem": row["problem"]} for row in rows
            if row["webhook_id"] == endpoint_id]
