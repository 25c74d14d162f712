"""Reading the console's query strings and forms: each bad value refused naming its field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.console.queries import ENDPOINT_ACTIONS, PAGE_ROWS
from worker.policy import category_problem

MAX_REASON_LENGTH = 500
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
        raise FieldError(field, f"must be a positive whole number, not {text[:40]!r}")
    return int(text)


def dead_letter_filters(query: Mapping[str, str]) -> dict[str, Any]:
    """The dead-letter page's filters (absent or empty: any)."""
    endpoint = query.get("endpoint", "").strip()
    filters: dict[str, Any] = {"webhook_id": identifier("endpoint", endpoint) if endpoint else None}
    for field, key in (("event_type", "event_type"), ("category", "category")):
        value = query.get(field, "").strip()
        if len(value) > MAX_FILTER_LENGTH or not value.isprintable():
            raise FieldError(field, f"at most {MAX_FILTER_LENGTH} printable characters")
        filters[key] = value or None
    problem = None if filters["category"] is None else category_problem(filters["category"])
    if problem is not None:
        raise FieldError("category", problem)
    return filters


def tenant_filter(query: Mapping[str, str]) -> str | None:
    """A page's tenant filter (`?tenant=NAME`; absent or empty: every tenant the caller sees)."""
    value = query.get("tenant", "").strip()
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


def endpoint_action(text: str) -> str:
    if text not in ENDPOINT_ACTIONS:
        raise FieldError("action", f"must be one of {', '.join(ENDPOINT_ACTIONS)}")
    return text
