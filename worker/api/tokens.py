"""/v1/token and /v1/tokens: the caller itself, and the API's tokens (never the tokens themselves)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

import psycopg
from aiohttp import web
from pydantic import Field

from worker.api.answers import Answer
from worker.api.common import state_of
from worker.api.declare import Route, body_of, ref_of
from worker.api.inputs import (
    Body,
)
from worker.observability import get_logger
from worker.rules import tokens as token_rules
from worker.rules.tokens import Role
from worker.store import tokens as token_store
from worker.web.context import (
    FLEET_ADMIN,
    caller_of,
    json_response,
)
from worker.web.problems import conflict, invalid, not_found


async def whoami(request: web.Request) -> web.Response:
    caller = caller_of(request)
    return json_response({"name": caller.name, "role": caller.role})


class Token(Answer):
    name: str
    role: Role
    tenant: str | None
    state: Literal["active", "expired", "revoked"]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenList(Answer):
    items: list[Token]


class TokenCreated(Answer):
    name: str
    role: Role
    tenant: str | None
    expires_at: datetime | None
    token: str = Field(description="shown once: only its hash is stored")


class TokenRevoked(Answer):
    name: str
    state: Literal["revoked"]


class TokenCreate(Body):
    name: str = Field(min_length=1, max_length=token_rules.MAX_NAME_LENGTH)
    role: Role
    tenant: str | None = Field(default=None, min_length=1,
                               description="the tenant it is kept to (required for tenant_admin; "
                                           "never for admin)")
    expires_in_days: float | None = Field(default=None, gt=0, le=token_rules.MAX_EXPIRES_DAYS)


async def list_tokens(request: web.Request) -> web.Response:
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        tokens = await token_store.listing(conn)
    return json_response({"items": tokens})


async def create_token(request: web.Request) -> web.Response:
    body = body_of(request, TokenCreate)
    problem = token_rules.name_problem(body.name)
    if problem is not None:
        raise invalid("name", problem)
    problem = token_rules.scope_problem(body.role, body.tenant)
    if problem is not None:
        raise invalid("tenant", problem)
    expires_at = None if body.expires_in_days is None \
        else datetime.now(UTC) + timedelta(days=body.expires_in_days)
    caller = caller_of(request)
    try:
        async with state_of(request).db.transaction(caller) as conn:
            token = await token_store.create(conn, body.name, body.role, expires_at, body.tenant)
    except psycopg.errors.UniqueViolation:
        raise conflict(f"name: a token named {body.name!r} exists", field="name") from None
    except psycopg.errors.NoDataFound:
        raise invalid("tenant", "no tenant with this name") from None
    get_logger().info("api created a token", token=body.name, role=body.role, tenant=body.tenant,
                      by=caller.name)
    return json_response({"name": body.name, "role": body.role, "tenant": body.tenant,
                          "expires_at": expires_at, "token": token}, status=201)


async def revoke_token(request: web.Request) -> web.Response:
    name = ref_of(request)
    caller = caller_of(request)
    async with state_of(request).db.transaction(caller) as conn:
        revoked = await token_store.revoke(conn, name)
    if not revoked:
        raise not_found(f"token {name} (no active token with this name)")
    get_logger().info("api revoked a token", token=name, by=caller.name)
    return json_response({"name": name, "state": "revoked"})


ROUTES: list[Route] = [
    Route("GET", "/v1/tokens", list_tokens, "API tokens (never the tokens themselves)", FLEET_ADMIN,
          {200: TokenList}),
    Route("POST", "/v1/tokens", create_token, "Create a token: shown once, in this answer", FLEET_ADMIN,
          {201: TokenCreated}, body=TokenCreate, refusals=(409,)),
    Route("POST", "/v1/tokens/{name}/revoke", revoke_token, "Revoke a token: it stops at once", FLEET_ADMIN,
          {200: TokenRevoked}, path_id="name", refusals=(404,)),
]
