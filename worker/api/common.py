"""What the /v1 handlers share: the request's state, who decided a change, the keys endpoint credentials
are sealed with, a page of a list and its `?tenant=` filter, a failure category as a filter."""

from __future__ import annotations

from typing import Annotated, Any

import psycopg
from aiohttp import web
from pydantic import AfterValidator, Field

from worker import encryption
from worker.api.inputs import (
    DEFAULT_PAGE,
    MAX_PAGE,
    Query,
)
from worker.rules.classification import CATEGORIES, category_problem
from worker.rules.tokens import Caller
from worker.store import tenants as tenant_store
from worker.web.context import (
    STATE,
    ApiState,
)
from worker.web.problems import Problem, invalid


def _category(value: str) -> str:
    # an unknown category matches nothing: a filter (or a bulk replay) that silently finds nothing
    problem = category_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Category = Annotated[str, AfterValidator(_category), Field(json_schema_extra={"enum": list(CATEGORIES)})]


def state_of(request: web.Request) -> ApiState:
    return request.app[STATE]


def decided_by(caller: Caller) -> str:
    """Who made a change, as the endpoint's events and the operations record it."""
    return f"api:{caller.name}"


def keyring_of(state: ApiState) -> encryption.Keyring:
    if state.keyring is None:
        raise Problem(503, "no-encryption-keys", "Endpoint credentials cannot be sealed",
                      "the API has no encryption keys (WEBHOOK_WORKER_ENCRYPTION_KEYS or "
                      "security.encryption_keys_file)")
    return state.keyring


# `?tenant=NAME` on the lists (routes.py's query models)
TENANT_FILTER: Any = Field(default=None, description="that tenant's rows only (a token kept to a tenant: "
                                                     "its own; another tenant is refused)")


async def narrow_to_tenant(conn: psycopg.AsyncConnection[Any], name: str | None) -> None:
    """`?tenant=NAME` on a list: the rest of the transaction sees that tenant's rows only, as a token
    kept to it would (row-level security and the views). A token already kept to a tenant finds no
    other (the tenants table shows it its own), so the filter never widens what it sees."""
    if name is None:
        return
    tenant_id = await tenant_store.tenant_id(conn, name)
    if tenant_id is None:
        raise invalid("tenant", "no tenant with this name")
    await tenant_store.keep_to(conn, tenant_id)


class Page(Query):
    limit: int = Field(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="rows per page")
