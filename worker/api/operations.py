"""/v1/operations: a bulk operation's progress, and stopping one."""

from __future__ import annotations

from aiohttp import web

from worker.api import answers
from worker.api.common import decided_by, state_of
from worker.api.declare import Route, id_of
from worker.observability import get_logger
from worker.store import operations as operation_store
from worker.web.context import (
    ADMIN,
    READ,
    caller_of,
    json_response,
)
from worker.web.problems import conflict, not_found


async def get_operation(request: web.Request) -> web.Response:
    operation_id = id_of(request)
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        operation = await operation_store.operation(conn, operation_id)
    if operation is None:
        raise not_found(f"operation {operation_id}")
    return json_response(operation)


async def cancel_operation(request: web.Request) -> web.Response:
    operation_id = id_of(request)
    caller = caller_of(request)
    async with state_of(request).db.transaction(caller) as conn:
        status = await operation_store.cancel(conn, operation_id, decided_by(caller))
        operation = await operation_store.operation(conn, operation_id)
    if status is None or operation is None:
        raise not_found(f"operation {operation_id}")
    if status != "cancelled":
        raise conflict(f"operation {operation_id} is {status}: only a running operation is cancelled")
    get_logger().info("api operation cancelled", operation_id=operation_id, by=caller.name)
    return json_response(operation)


ROUTES: list[Route] = [
    Route("GET", "/v1/operations/{id}", get_operation, "A bulk operation's progress", READ,
          {200: answers.Operation}, path_id="id", refusals=(404,)),
    Route("POST", "/v1/operations/{id}/cancel", cancel_operation,
          "Stop a running operation after the step it is in (again: 200; already done or failed: 409)",
          ADMIN, {200: answers.Operation}, path_id="id", refusals=(404, 409)),
]
