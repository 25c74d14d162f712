"""The event-type catalogue: its rules and rows, and a payload checked against its type's JSON Schema."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from worker.rules import wording
from worker.rules.schemas import (
    MAX_SCHEMA_DEPTH,
    PayloadProblem,
    SchemaUnusable,
    json_pointer,
    payload_problem,
    schema_problem,
    schema_text,
    stored_schema_problem,
)

__all__ = ["EventType", "EventTypeError", "PayloadProblem", "PublishProblem", "SchemaUnusable",
           "json_pointer", "payload_problem", "publish_problem", "schema_problem"]

# The queue's rule for event types (constraint event_type_printable), and no '*': subscriptions use
# it as a wildcard. SQL repeats these (constraints event_type_name_form and
# event_type_description_length of webhooks.event_types).
MAX_NAME_BYTES = 256
MAX_DESCRIPTION_CHARS = 2000
# The worker's own types: catalogued by the migrations, changed by no caller.
RESERVED_PREFIX = "webhook."

class EventTypeError(ValueError):
    """A catalogue change that breaks a rule: the message names the field and the problem."""


@dataclass(frozen=True)
class EventType:
    name: str
    description: str
    schema: Any | None  # a JSON Schema (draft 2020-12): an object or a boolean; None: any payload
    deprecated: bool

    @cached_property
    def schema_text(self) -> str | None:
        """The schema as JSON text: what its compiled validator is kept by."""
        return None if self.schema is None else schema_text(self.schema)

    @property
    def problem(self) -> str | None:
        """Why its schema cannot be used (stored before the rules worker.rules.schemas applies when one is
        written, or written around them in SQL): publishes of the type are refused until it is
        replaced. None for a schema that can, or none."""
        return None if self.schema_text is None else stored_schema_problem(self.schema_text)


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
    return reserved_problem(name)


def reserved_problem(name: str) -> str | None:
    """Why a type may not be changed by any caller (the worker's own, catalogued by the migrations),
    or None."""
    if name.startswith(RESERVED_PREFIX):
        return f"types starting with {RESERVED_PREFIX!r} are the worker's own"
    return None


def schema_from_text(text: str) -> Any:
    """A JSON Schema written as text (the CLI's --schema, the console's form): the JSON it holds, or
    EventTypeError naming the field when it is not JSON. upsert() checks that it is a JSON Schema."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise EventTypeError(f"schema: not JSON ({exc})") from None
    except RecursionError:
        raise EventTypeError(f"schema: nested more than {MAX_SCHEMA_DEPTH} deep (objects and arrays "
                             "within each other)") from None


def type_problem(event_type: str, known: EventType | None, require_known: bool) -> PublishProblem | None:
    """Whether a publish of this type may go ahead before its payload is looked at: the catalogue's
    entry for the type (None: not catalogued) and the setting api.require_known_event_types decide.
    A deprecated type is still accepted: its subscribers still receive it."""
    if known is None and require_known:
        return PublishProblem("event_type", f"{wording.quoted(event_type)} is not in the event-type "
                              "catalogue (api.require_known_event_types refuses unknown types)")
    return None


def unusable_schema(event_type: str, problem: str) -> PublishProblem:
    """The refusal of a publish whose type's stored schema breaks the rules (EventType.problem,
    SchemaUnusable)."""
    return PublishProblem("event_type", f"the schema of event type {wording.quoted(event_type)} cannot "
                          f"be used ({problem}); an administrator must replace it (event-types set)")


def payload_refusal(event_type: str, problem: PayloadProblem) -> PublishProblem:
    """The refusal of a payload that does not follow its type's schema, naming where."""
    where = f"at {problem.pointer}: " if problem.pointer else ""
    of_type = f"(the schema of event type {wording.quoted(event_type)})"
    return PublishProblem("payload", f"{where}{problem.message} {of_type}", problem.pointer)


def publish_problem(event_type: str, known: EventType | None, payload: Any,
                    require_known: bool) -> PublishProblem | None:
    """type_problem(), then the payload checked against the type's schema here and now (the API checks
    payloads in processes of their own, within a time budget: worker.web.schema_checks)."""
    refused = type_problem(event_type, known, require_known)
    if refused is not None or known is None:
        return refused
    try:
        problem = payload_problem(known.schema, payload)
    except SchemaUnusable as exc:
        return unusable_schema(event_type, str(exc))
    return None if problem is None else payload_refusal(event_type, problem)


# --- The catalogue's rows (sql/functions/event_types.sql; worker.store.event_types reads them) -------


def from_row(row: dict[str, Any]) -> EventType:
    return EventType(str(row["name"]), str(row["description"]), row["schema"], bool(row["deprecated"]))


def unmatched_of_endpoint(rows: list[dict[str, Any]], endpoint_id: int) -> list[dict[str, Any]]:
    """One endpoint's rows of unmatched_subscriptions(): its patterns and their problem (what
    `endpoints show` and the console's endpoint page show)."""
    return [{"pattern": row["pattern"], "problem": row["problem"]} for row in rows
            if row["webhook_id"] == endpoint_id]
