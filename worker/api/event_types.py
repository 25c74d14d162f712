"""/v1/event-types: the event-type catalogue, and the caller's endpoints' subscriptions no current type
matches."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

from aiohttp import web
from pydantic import Field, JsonValue

from worker.api.answers import Answer
from worker.api.common import state_of
from worker.api.declare import Route, body_of, ref_of
from worker.api.inputs import (
    Body,
)
from worker.observability import get_logger
from worker.rules import event_types
from worker.store.event_types import deprecate, get, rows, unmatched_subscriptions, upsert
from worker.web.context import (
    FLEET_ADMIN,
    READ,
    caller_of,
    json_response,
)
from worker.web.problems import invalid, not_found
from worker.web.schema_checks import with_problems


class EventTypeAnswer(Answer):
    name: str
    description: str
    # `schema` is a BaseModel attribute: the field is named apart and written as `schema`
    json_schema: JsonValue = Field(alias="schema", description="the JSON Schema of its payloads; null: any")
    deprecated: bool
    problem: str | None = Field(description="why its schema cannot be used (stored before the rules a "
                                            "schema is written by): publishes of the type are refused "
                                            "until it is replaced; null: none")


class CataloguedType(EventTypeAnswer):
    created_at: datetime
    updated_at: datetime


class UnmatchedSubscription(Answer):
    endpoint_id: int
    endpoint_name: str
    pattern: str
    problem: Literal["unknown", "deprecated"] = Field(
        description="unknown: no catalogued type matches; deprecated: only deprecated ones do")


class EventTypeList(Answer):
    items: list[CataloguedType]
    unmatched_subscriptions: list[UnmatchedSubscription] = Field(
        description="the caller's endpoints' subscriptions that match no current type")


class EventTypeBody(Body):
    description: str = Field(default="", max_length=event_types.MAX_DESCRIPTION_CHARS)
    # `schema` is a BaseModel attribute: the field is named apart and read and written as `schema`
    json_schema: JsonValue = Field(default=None, alias="schema",
                                   description="a JSON Schema (draft 2020-12) the payloads follow; null: any")
    deprecated: bool | None = Field(default=None, description="absent: as it was (a new type: false)")


class DeprecateBody(Body):
    """Optional: without it, the type is deprecated."""

    deprecated: bool = Field(default=True, description="false: current again")


def _type_name(request: web.Request) -> str:
    name = ref_of(request)
    problem = event_types.name_problem(name)
    if problem is not None:
        raise invalid("name", problem)
    return name


async def _event_type(found: event_types.EventType) -> dict[str, Any]:
    [found] = await with_problems([found])
    return {"name": found.name, "description": found.description, "schema": found.schema,
            "deprecated": found.deprecated, "problem": found.problem}


def _where(name: str) -> str:
    return "/v1/event-types/" + quote(name, safe="")


async def list_event_types(request: web.Request) -> web.Response:
    """The catalogue, and the caller's endpoints' subscriptions no current type matches."""
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        items = await rows(conn)
        unmatched = [{"endpoint_id": row["webhook_id"], "endpoint_name": row["endpoint_name"],
                      "pattern": row["pattern"], "problem": row["problem"]}
                     for row in await unmatched_subscriptions(conn)]
    entries = await with_problems([event_types.from_row(item) for item in items])
    for item, entry in zip(items, entries, strict=True):
        item["problem"] = entry.problem
    return json_response({"items": items, "unmatched_subscriptions": unmatched})


async def get_event_type(request: web.Request) -> web.Response:
    name = ref_of(request)
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        found = await get(conn, name)
    if found is None:
        raise not_found(f"event type {name}")
    return json_response(await _event_type(found))


async def put_event_type(request: web.Request) -> web.Response:
    name = _type_name(request)
    body = body_of(request, EventTypeBody)

    try:
        async with state_of(request).db.transaction(caller_of(request)) as conn:
            created = await upsert(conn, name, body.description, body.json_schema, body.deprecated)
            found = await get(conn, name)
    except event_types.EventTypeError as exc:
        field, _, detail = str(exc).partition(": ")
        raise invalid(field, detail) from None
    assert found is not None
    get_logger().info("api set an event type", event_type=name, created=created, by=caller_of(request).name)
    return json_response(await _event_type(found), status=201 if created else 200,
                         location=_where(name) if created else None)


async def deprecate_event_type(request: web.Request) -> web.Response:
    name = _type_name(request)
    body = body_of(request, DeprecateBody)

    async with state_of(request).db.transaction(caller_of(request)) as conn:
        found = await get(conn, name) if await deprecate(conn, name, body.deprecated) else None
    if found is None:
        raise not_found(f"event type {name}")
    return json_response(await _event_type(found))


ROUTES: list[Route] = [
    Route("GET", "/v1/event-types", list_event_types,
          "The event-type catalogue, and the caller's endpoints' subscriptions that match no current type",
          READ, {200: EventTypeList}),
    Route("GET", "/v1/event-types/{name}", get_event_type, "An event type", READ, {200: EventTypeAnswer},
          path_id="name", refusals=(404,)),
    Route("PUT", "/v1/event-types/{name}", put_event_type,
          "Add an event type (201), or replace its description and schema (200)", FLEET_ADMIN,
          {200: EventTypeAnswer, 201: EventTypeAnswer}, body=EventTypeBody, path_id="name"),
    Route("POST", "/v1/event-types/{name}/deprecate", deprecate_event_type,
          "Mark an event type deprecated (or, with deprecated false, current again)", FLEET_ADMIN,
          {200: EventTypeAnswer}, body=DeprecateBody, body_required=False, path_id="name", refusals=(404,)),
]
