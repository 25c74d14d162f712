"""Reading what a request gives: JSON bodies checked against models, query parameters, cursors."""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import datetime
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from worker.api.problems import Problem, bad_request, invalid, unsupported_media_type

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
Model = TypeVar("Model", bound=BaseModel)


class Body(BaseModel):
    """A request body: unknown fields refused, types not coerced (a number is not a string)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


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
    field = prefix + ".".join(str(part) for part in error["loc"]) or "(body)"
    field = "".join(c if c.isprintable() else repr(c)[1:-1] for c in field)[:200]
    if error["type"] == "extra_forbidden":
        return invalid(field, "unknown field")
    if error["type"] == "missing":
        return invalid(field, "required")
    return invalid(field, error["msg"].removeprefix("Value error, "))


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def path_id(request: web.Request, name: str = "id") -> int:
    value = request.match_info[name]
    if not value.isdigit() or not 0 < int(value) <= MAX_ID:
        raise invalid(name, "expected a positive integer id")
    return int(value)


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


def printable_text(field: str, value: str) -> str:
    """A text parameter without control characters (PostgreSQL's text cannot even hold NUL)."""
    if not value.isprintable():
        raise invalid(field, "must not hold control characters")
    return value


def query_params(request: web.Request, allowed: set[str]) -> dict[str, str]:
    """The query parameters, each at most once, none unknown, none with control characters."""
    params: dict[str, str] = {}
    for name, value in request.query.items():
        if name not in allowed:
            raise invalid(name, f"unknown query parameter; expected one of {', '.join(sorted(allowed))}")
        if name in params:
            raise invalid(name, "given more than once")
        params[name] = printable_text(name, value)
    return params


def limit_param(params: dict[str, str]) -> int:
    value = params.get("limit")
    if value is None:
        return DEFAULT_PAGE
    if not value.isdigit() or not 1 <= int(value) <= MAX_PAGE:
        raise invalid("limit", f"expected an integer from 1 to {MAX_PAGE}")
    return int(value)


def timestamp_param(params: dict[str, str], name: str) -> datetime | None:
    value = params.get(name)
    if value is None:
        return None
    return timestamp(value, name)


def timestamp(value: str, field: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise invalid(field, "expected an RFC 3339 timestamp such as 2026-11-26T12:00:00Z") from None
    if parsed.tzinfo is None:
        raise invalid(field, "the timestamp needs a time zone (Z or an offset)")
    return parsed


def encode_cursor(*position: Any) -> str:
    """An opaque position after the last row of a page."""
    return base64.urlsafe_b64encode(orjson.dumps(list(position), default=str)).decode().rstrip("=")


def decode_cursor(value: str, shape: tuple[type, ...]) -> list[Any]:
    """A cursor made by encode_cursor with values of these types (datetimes as ISO text)."""
    try:
        position = orjson.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError):
        raise invalid("cursor", "not a cursor this API returned") from None
    if not isinstance(position, list) or len(position) != len(shape):
        raise invalid("cursor", "not a cursor this API returned")
    decoded: list[Any] = []
    for item, kind in zip(position, shape, strict=True):
        if kind is datetime and isinstance(item, str):
            try:
                decoded.append(datetime.fromisoformat(item))
            except ValueError:
                raise invalid("cursor", "not a cursor this API returned") from None
        elif kind is int and isinstance(item, int) and not isinstance(item, bool) and 0 < item <= MAX_ID:
            decoded.append(item)
        else:
            raise invalid("cursor", "not a cursor this API returned")
    return decoded
