"""One declaration per /v1 route (method, path, roles, inputs, answers): the API's role checks, its
input validation and its OpenAPI document (worker.api.openapi) all read the same `Route`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel

from worker.api.inputs import (
    Body,
    NoQuery,
    Query,
    path_id,
    path_ref,
    read_body,
    read_optional_body,
    read_query,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Model = TypeVar("Model", bound=BaseModel)
# `{id}` in a path: "id" an integer id; "ref" an id or a name (all digits: always the id);
# `{name}` in a path: "name" a name alone (an event type's, a token's), whatever its characters
PathId = Literal["id", "ref", "name"]


class NoBody(Body):
    """Routes that take no body accept `{}` or nothing, and refuse any field."""


@dataclass(frozen=True)
class Given:
    """What the declaration read from a request before its handler runs."""

    body: BaseModel | None
    query: BaseModel
    id: int | str | None


GIVEN = web.RequestKey("webhook_api_given", Given)


@dataclass(frozen=True)
class Header:
    """A request header a route reads; its handler checks it against `schema` (documented as is)."""

    name: str
    schema: dict[str, Any]
    description: str


@dataclass(frozen=True)
class Route:
    """A /v1 route. `answers` maps each success status to its body's model (None: no body);
    `refusals` lists the error statuses it answers besides the ones every route may."""

    method: str
    path: str
    handler: Handler
    summary: str
    roles: tuple[str, ...]
    answers: Mapping[int, type[BaseModel] | None]
    body: type[BaseModel] | None = None
    # a body whose fields are all optional may be left out entirely
    body_required: bool = True
    query: type[Query] = NoQuery
    path_id: PathId | None = None
    refusals: tuple[int, ...] = ()
    headers: tuple[Header, ...] = ()
    # no token needed (the document itself)
    public: bool = False
    # a token that passed within the failed-authentication window is checked by the handler, in the
    # round trip that reads what it needs first (ApiState.publishing()), rather than in one of its own
    # before it (any other token is checked first, as on every route, before the body is read); a
    # handler that ends otherwise (a refusal of its input) has it checked before it answers
    token_checked_by_handler: bool = False

    @property
    def takes_body(self) -> bool:
        """POST, PUT, PATCH and DELETE read a body: their model's, or `{}` / nothing."""
        return self.method in ("POST", "PUT", "PATCH", "DELETE")

    def serve(self) -> Handler:
        """The aiohttp handler: reads the path id, the query and the body by this declaration, then
        calls the route's own handler. Roles are checked before, by the API's middleware."""
        route = self

        async def serve(request: web.Request) -> web.StreamResponse:
            found: int | str | None = None
            if route.path_id == "id":
                found = path_id(request)
            elif route.path_id == "ref":
                found = path_ref(request)
            elif route.path_id == "name":
                found = path_ref(request, "name")
            query = read_query(request, route.query)
            body: BaseModel | None = None
            if route.takes_body:
                model = route.body or NoBody
                if route.body is not None and route.body_required:
                    body = await read_body(request, model)
                else:
                    body = await read_optional_body(request, model)
            request[GIVEN] = Given(body, query, found)
            return await route.handler(request)

        serve.route = route  # type: ignore[attr-defined]
        return serve


def route_of(handler: Any) -> Route | None:
    """The declaration an aiohttp handler serves, or None (the probes, the console)."""
    found = getattr(handler, "route", None)
    return found if isinstance(found, Route) else None


def body_of(request: web.Request, model: type[Model]) -> Model:
    body = request[GIVEN].body
    if not isinstance(body, model):
        raise TypeError(f"the route declares no {model.__name__} body")
    return body


def query_of(request: web.Request, model: type[Model]) -> Model:
    query = request[GIVEN].query
    if not isinstance(query, model):
        raise TypeError(f"the route declares no {model.__name__} query")
    return query


def id_of(request: web.Request) -> int:
    found = request[GIVEN].id
    if not isinstance(found, int):
        raise TypeError("the route declares no integer {id}")
    return found


def ref_of(request: web.Request) -> str:
    found = request[GIVEN].id
    if not isinstance(found, str):
        raise TypeError("the route declares no {id} by id or name")
    return found
