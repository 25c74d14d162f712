"""Reading what a request gives: JSON bodies, query strings and path ids checked against models, cursors."""

from __future__ import annotations

import functools
import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar, get_args

import orjson
from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from worker.rules import wording
from worker.web.problems import Problem, bad_request, invalid, unsupported_media_type

MAX_PAGE = 1000
DEFAULT_PAGE = 100
# Bigint ids: anything larger cannot name a row, and PostgreSQL would refuse it with a less clear error.
MAX_ID = 2**63 - 1
# The bounds of PostgreSQL's integer types, for fields stored in them: a value beyond is refused as
# the field's problem (422) rather than met as the database's out-of-range error.
SMALLINT = (-(2**15), 2**15 - 1)
INTEGER_MAX = 2**31 - 1
BIGINT_MAX = MAX_ID
# JSON numbers orjson keeps exact: a 64-bit integer (signed or unsigned); beyond, it reads a float.
_LONG_NUMBER = re.compile(rb"\d{19,}")
# Text the API takes holds no control characters (C0, DEL, C1): PostgreSQL's text cannot hold NUL, and
# the others have no business in names, keys and types. The same pattern is in the OpenAPI document.
NO_CONTROL = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# A name (of an endpoint, a tenant): not all ASCII digits (those always mean an id), no control
# characters. Documents the rule; the names' own checks (worker.rules.registration,
# worker.rules.tenants) hold it.
NAME_PATTERN = "^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\x00-\\x1f\\x7f-\\x9f0-9][^\\x00-\\x1f\\x7f-\\x9f]*$"
# RFC 3339 date-time (section 5.6), as JSON Schema's format date-time reads it
_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
# A dead-letter cursor: the last row's dead_lettered_at (microseconds since the epoch) and its id.
DEAD_LETTER_CURSOR = r"^\d{1,16}\.[1-9]\d{0,17}$"
Model = TypeVar("Model", bound=BaseModel)


class Body(BaseModel):
    """A request body: unknown fields refused, types not coerced (a number is not a string)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _integral_numbers(cls, data: Any) -> Any:
        # JSON has one number type: 5.0 is the integer 5 (JSON Schema's `integer` says so too), which
        # strict validation alone would refuse for an integer field
        if not isinstance(data, dict):
            return data
        integers = _integer_fields(cls)
        found = {name: int(value) for name, value in data.items()
                 if name in integers and isinstance(value, float) and value.is_integer()}
        return {**data, **found} if found else data


@functools.cache
def _integer_fields(model: type[BaseModel]) -> frozenset[str]:
    def holds_int(annotation: Any) -> bool:
        if annotation is int:
            return True
        return any(holds_int(arg) for arg in get_args(annotation) if arg is not bool)

    return frozenset(name for name, field in model.model_fields.items() if holds_int(field.annotation))


def is_json(content_type: str) -> bool:
    """application/json, or a JSON-based type (RFC 6839: `+json`), parameters aside."""
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_json(request: web.Request) -> Any:
    # aiohttp refuses a body above api.max_body_bytes (413) before reading it all
    raw = await request.read()
    if not raw.strip():
        raise bad_request("the body is empty; a JSON object was expected", "invalid-json")
    # a body sent as text or a form is refused rather than read as JSON: it was not meant as JSON,
    # and a browser can send those cross-origin without a preflight
    given = request.headers.get("Content-Type", "")
    if not is_json(given):
        raise unsupported_media_type(given)
    if _LONG_NUMBER.search(raw):
        _refuse_rounded_integers(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}", "invalid-json") from None


async def read_body(request: web.Request, model: type[Model]) -> Model:
    data = await read_json(request)
    if not isinstance(data, dict):
        raise invalid("(body)", f"expected a JSON object, got {_json_type(data)}")
    return parse(model, data)


async def read_optional_body(request: web.Request, model: type[Model]) -> Model:
    """A body whose fields are all optional: none at all reads as `{}`."""
    if not (await request.read()).strip():
        return parse(model, {})
    return await read_body(request, model)


def parse(model: type[Model], data: dict[str, Any], prefix: str = "") -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise field_problem(exc, prefix) from None


def field_problem(exc: ValidationError, prefix: str = "") -> Problem:
    """The first error, naming the field in dotted form; a value given is never echoed (it may be a
    credential)."""
    # an unknown field first: a misspelt name also explains the "required" error of the right one
    error = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    field = prefix + ".".join(str(part) for part in error["loc"] if not _union_member(part)) or "(body)"
    field = "".join(c if c.isprintable() else repr(c)[1:-1] for c in field)[:200]
    if error["type"] == "extra_forbidden":
        return invalid(field, "unknown field")
    if error["type"] == "missing":
        return invalid(field, "required")
    return invalid(field, wording.field_message(error))


# the member of a union an error is about (`endpoint.constrained-int`): not a field of the request
_MEMBER_TAGS = {"int", "str", "float", "bool", "none", "list", "dict", "constrained-int", "constrained-str",
                "constrained-float", "datetime"}


def _union_member(part: str | int) -> bool:
    return isinstance(part, str) and (part in _MEMBER_TAGS or "[" in part)


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _refuse_rounded_integers(raw: bytes) -> None:
    """orjson reads an integer beyond 64 bits as a float, so 18446744073709551617 would be stored as
    18446744073709552000: refused instead. Only bodies with a long run of digits are read again."""

    def exact(text: str) -> int:
        value = int(text)
        if not -(2**63) <= value < 2**64:
            raise ValueError(text)
        return value

    try:
        json.loads(raw, parse_int=exact)
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            return  # orjson read it; a difference in what the two accept is not this check's business
        raise invalid("(body)", f"the integer {str(exc)[:40]} is outside the 64-bit range; send it as a"
                                " string") from None


def control_problem(value: str) -> str | None:
    return "must not hold control characters" if _CONTROL.search(value) else None


def _no_control(value: str) -> str:
    problem = control_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# Text without control characters: validated by _no_control, documented by the same pattern.
Text = Annotated[str, AfterValidator(_no_control), Field(json_schema_extra={"pattern": NO_CONTROL})]


def timestamp_problem(value: str) -> tuple[datetime | None, str | None]:
    """An RFC 3339 timestamp with its offset, or why not."""
    match = _RFC3339.match(value)
    if match is None:
        if re.match(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?$", value):
            return None, "the timestamp needs a time zone (Z or an offset)"
        return None, "expected an RFC 3339 timestamp such as 2026-11-26T12:00:00Z"
    day, time, fraction, offset = match.groups()
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        parsed = datetime.fromisoformat(f"{day}T{time}{(fraction or '')[:7]}{offset}")
        parsed.astimezone(UTC)  # a time at the edge of the calendar that UTC cannot hold
    except (ValueError, OverflowError):
        return None, "not a date and time that exists"
    return parsed, None


def timestamp(value: str, field: str) -> datetime:
    parsed, problem = timestamp_problem(value)
    if parsed is None:
        raise invalid(field, problem or "invalid")
    return parsed


def _timestamp_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError("expected an RFC 3339 timestamp string")
    parsed, problem = timestamp_problem(value)
    if parsed is None:
        raise ValueError(problem)
    return parsed


# An RFC 3339 timestamp string, read as an aware datetime.
Timestamp = Annotated[datetime, BeforeValidator(_timestamp_value),
                      WithJsonSchema({"type": "string", "format": "date-time"})]
# A positive bigint id.
Id = Annotated[int, Field(ge=1, le=MAX_ID)]


# An endpoint or a tenant, by id or by name: a string of digits is the id too (names cannot be all
# digits), as the CLI's ENDPOINT arguments.
Ref = Id | Annotated[str, AfterValidator(_no_control),
                     Field(min_length=1, json_schema_extra={"pattern": NO_CONTROL})]


def some_field_given(schema: dict[str, Any]) -> None:
    """A PATCH body's schema: at least one field, and at least one of them not null (null there
    means "leave as it is", so a body of nulls changes nothing and is refused)."""
    schema["minProperties"] = 1
    schema["anyOf"] = [{"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                       for name in schema.get("properties", {})]


def one_field_given(schema: dict[str, Any]) -> None:
    """A PATCH body's schema where null is a value (it clears a limit): at least one field."""
    schema["minProperties"] = 1


class Query(BaseModel):
    """A query string: unknown parameters refused; values are text read as their declared type."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoQuery(Query):
    pass


def read_query(request: web.Request, model: type[Model]) -> Model:
    """The query parameters, each at most once, read by the route's query model."""
    params: dict[str, str] = {}
    for name, value in request.query.items():
        if name in params:
            raise invalid(name, "given more than once")
        params[name] = value
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        problem = field_problem(exc)
        if problem.field in params and problem.detail == f"{problem.field}: unknown field":
            expected = ", ".join(sorted(model.model_fields)) or "none"
            raise invalid(problem.field, f"unknown query parameter; expected {expected}") from None
        raise problem from None


def path_id(request: web.Request, name: str = "id") -> int:
    """An integer id in the path: 1 to 2^63-1."""
    value = request.match_info[name]
    if not (value.isascii() and value.isdigit()) or not 0 < int(value) <= MAX_ID:
        raise invalid(name, "expected a positive integer id")
    return int(value)


def path_ref(request: web.Request, name: str = "id") -> str:
    """An id or a name in the path (all digits: the id), without control characters."""
    value = request.match_info[name]
    problem = control_problem(value)
    if problem is not None:
        raise invalid(name, problem)
    return value


def dead_letter_cursor(value: str) -> tuple[datetime, int]:
    """The position a dead-letter page's next_cursor names: dead_lettered_at and delivery id."""
    if re.match(DEAD_LETTER_CURSOR, value) is None:
        raise invalid("cursor", "not a cursor this API returned")
    micros, _, after_id = value.partition(".")
    seconds, fraction = divmod(int(micros), 1_000_000)
    try:
        at = datetime.fromtimestamp(seconds, UTC).replace(microsecond=fraction)
    except (ValueError, OverflowError, OSError):
        raise invalid("cursor", "not a cursor this API returned") from None
    return at, int(after_id)


def encode_dead_letter_cursor(at: datetime, delivery_id: int) -> str:
    delta = at - datetime(1970, 1, 1, tzinfo=UTC)
    micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return f"{micros}.{delivery_id}"
