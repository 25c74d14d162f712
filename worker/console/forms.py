"""Reading the console's query strings and forms: each bad value refused naming its field."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from worker.console.queries import ENDPOINT_ACTIONS, PAGE_ROWS
from worker.rules import wording
from worker.rules.classification import category_problem
from worker.rules.endpoints import MAX_REASON_CHARS

MAX_REASON_LENGTH = MAX_REASON_CHARS  # the API's limit too: one rule
MAX_FILTER_LENGTH = 200
MAX_ID = 2**63 - 1


class FieldError(ValueError):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def identifier(field: str, text: str) -> int:
    text = text.strip()
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= MAX_ID:
        raise FieldError(field, f"must be a positive whole number, not {wording.json_text(text, 40)}")
    return int(text)


def dead_letter_filters(query: Mapping[str, Any]) -> dict[str, Any]:
    """The dead-letter page's filters (absent or empty: any). `endpoint` is a name or an id, as the
    CLI's ENDPOINT arguments; the page finds its id (webhooks.endpoint_ref)."""
    filters: dict[str, Any] = {}
    for field, key in (("endpoint", "endpoint"), ("event_type", "event_type"), ("category", "category")):
        value = query.get(field, "")
        value = value.strip() if isinstance(value, str) else ""
        if len(value) > MAX_FILTER_LENGTH or not value.isprintable():
            raise FieldError(field, f"at most {MAX_FILTER_LENGTH} printable characters")
        filters[key] = value or None
    problem = None if filters["category"] is None else category_problem(filters["category"])
    if problem is not None:
        raise FieldError("category", problem)
    return filters


STATUSES = ("pending", "delivering", "retrying", "delivered", "dead_letter")


def _moment(field: str, text: str) -> datetime | None:
    """A time from the search form (a datetime-local field: no zone, read as UTC), or None."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise FieldError(field, f"expected a time such as 2026-11-27T04:00, not {wording.json_text(text, 40)}"
                         ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def delivery_search(query: Mapping[str, str]) -> dict[str, Any]:
    """The delivery search's fields (absent or empty: any): id, idempotency key, event type, status,
    endpoint (a name or an id), created since and until."""
    found: dict[str, Any] = {}
    for field in ("id", "key", "event_type", "status", "endpoint", "since", "until"):
        value = query.get(field, "").strip()
        if len(value) > MAX_FILTER_LENGTH or not value.isprintable():
            raise FieldError(field, f"at most {MAX_FILTER_LENGTH} printable characters")
        found[field] = value or None
    if found["id"] is not None:
        found["id"] = identifier("id", found["id"])
    if found["status"] is not None and found["status"] not in STATUSES:
        raise FieldError("status", f"must be one of {', '.join(STATUSES)}")
    found["since"] = _moment("since", found["since"] or "")
    found["until"] = _moment("until", found["until"] or "")
    return found


def tenant_filter(query: Mapping[str, Any]) -> str | None:
    """A page's tenant filter (`?tenant=NAME`; absent or empty: every tenant the caller sees)."""
    value = query.get("tenant", "")
    value = value.strip() if isinstance(value, str) else ""
    if len(value) > MAX_FILTER_LENGTH or not value.isprintable():
        raise FieldError("tenant", f"at most {MAX_FILTER_LENGTH} printable characters")
    return value or None


def selected_ids(values: list[str]) -> list[int]:
    """The deliveries ticked on the dead-letter page."""
    if not values:
        raise FieldError("delivery_id", "select at least one dead letter to replay")
    if len(values) > PAGE_ROWS:
        raise FieldError("delivery_id", f"at most {PAGE_ROWS} at once")
    return sorted({identifier("delivery_id", v) for v in values})


def checked(value: Any) -> bool:
    """A checkbox: sent ("true") when ticked, absent when not."""
    return bool(value == "true")


def reason(text: str) -> str:
    """Why an operator changes an endpoint: required, recorded with the change."""
    text = " ".join(text.split())
    if not text:
        raise FieldError("reason", "say why (it is recorded with the change)")
    if len(text) > MAX_REASON_LENGTH:
        raise FieldError("reason", f"at most {MAX_REASON_LENGTH} characters")
    if not text.isprintable():
        raise FieldError("reason", "must be printable (no control characters)")
    return text


def endpoint_fields(form: Mapping[str, Any], creating: bool) -> dict[str, Any]:
    """The endpoint form's fields as the endpoint service's models take them (they check every
    bound); an empty field is left out (a change keeps what is stored), event types are separated by
    commas or spaces."""
    fields: dict[str, Any] = {}
    for field in ("name", "url", "body_format", "description") if creating else ("url", "body_format",
                                                                                  "description"):
        value = form.get(field)
        if isinstance(value, str) and value.strip():
            fields[field] = value.strip()
    types = form.get("event_types")
    if isinstance(types, str) and types.strip():
        fields["event_types"] = types.replace(",", " ").split()
    if not creating and not fields:
        raise FieldError("(form)", "nothing to change: fill in at least one field")
    return fields


def endpoint_action(text: str) -> str:
    if text not in ENDPOINT_ACTIONS:
        raise FieldError("action", f"must be one of {', '.join(ENDPOINT_ACTIONS)}")
    return text


def event_type_form(form: Mapping[str, Any]) -> dict[str, Any]:
    """The event-type form as typed, to be written or shown again with its error: the name without
    surrounding spaces, the description and schema as typed (worker/rules/event_types.py checks each)."""

    def text(field: str) -> str:
        value = form.get(field)
        # a browser sends a textarea's line breaks as CRLF: stored as the CLI's and the API's are
        return value.replace("\r\n", "\n") if isinstance(value, str) else ""

    return {"name": text("name").strip(), "description": text("description"), "schema": text("schema"),
            "deprecated": text("deprecated") == "true"}


def deprecated(form: Mapping[str, Any]) -> bool:
    """The deprecate button's value: true deprecates, false makes the type current again."""
    value = form.get("deprecated")
    if value not in ("true", "false"):
        raise FieldError("deprecated", "must be true or false")
    return bool(value == "true")


def trigger_key(text: str) -> str:
    """The primary key of the row to invoke a table trigger for: its value as text (a key of several
    columns: a JSON array of them), as `triggers invoke --key` takes it."""
    text = text.strip()
    if not text:
        raise FieldError("key", "give the row's primary key")
    if len(text) > MAX_FILTER_LENGTH:
        raise FieldError("key", f"at most {MAX_FILTER_LENGTH} characters")
    if not text.isprintable():
        raise FieldError("key", "must be printable (no control characters)")
    return text
