"""/v1/triggers: the table triggers that turn an application's table changes into webhooks."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from aiohttp import web
from pydantic import Field

from worker.api.answers import Answer
from worker.api.common import state_of
from worker.api.declare import Route
from worker.store import triggers as trigger_store
from worker.web.context import ADMIN, caller_of, json_response

Op = Literal["insert", "update", "delete"]


class TableTrigger(Answer):
    name: str
    table_name: str = Field(description="SCHEMA.TABLE, as the table is named now (as it was, once dropped)")
    ops: list[Op] = Field(description="the statements that fire it")
    event_type: str
    columns: list[str] | None = Field(
        description="an update fires when one of these changed; null: any column not excluded")
    exclude_columns: list[str] = Field(description="columns never sent, in any op")
    when_condition: str | None = Field(description="only rows meeting this condition; null: every row")
    tenant: str | None = Field(
        description="the tenant whose endpoints get its events; null with a tenant column")
    tenant_column: str | None = Field(description="the column naming each row's tenant; null: a fixed tenant")
    enabled: bool
    state: Literal["enabled", "disabled", "table dropped", "trigger missing"] = Field(
        description="table dropped: the table is gone; trigger missing: its PostgreSQL triggers are not all"
                    " on the table, or one is disabled there")
    deliveries_last_hour: int
    backfill_id: int | None = Field(description="its latest backfill, an operation (GET /v1/operations/{id})")
    backfill_status: Literal["running", "done", "failed", "cancelled"] | None
    backfill_processed: int | None = Field(description="rows the backfill queued so far")
    backfill_scanned: int | None = Field(description="rows the backfill read so far")
    backfill_total_estimate: int | None = Field(description="the table's estimated rows when it started")
    created_by: str
    created_at: datetime
    updated_at: datetime


class TableTriggerList(Answer):
    items: list[TableTrigger]


async def list_triggers(request: web.Request) -> web.Response:
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        return json_response({"items": await trigger_store.listing(conn)})


ROUTES: list[Route] = [
    Route("GET", "/v1/triggers", list_triggers,
          "Table triggers, by name (a tenant's administrator: those of its tenant)", ADMIN,
          {200: TableTriggerList}),
]
