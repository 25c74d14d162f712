"""The OpenAPI 3.1 document of /v1: what every route takes and answers, and which roles may call it."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from worker import __version__
from worker import endpoints as endpoint_service
from worker.api import app as app_roles
from worker.api.inputs import BIGINT_MAX, INTEGER_MAX, SMALLINT
from worker.api.tokens import ROLES
from worker.policy import CATEGORIES

TIME = {"type": "string", "format": "date-time"}
NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
TEXT = {"type": "string"}
CATEGORY = {"type": "string", "enum": list(CATEGORIES)}
NULLABLE_TEXT = {"type": ["string", "null"]}
INT = {"type": "integer"}
NULLABLE_INT = {"type": ["integer", "null"]}
NULLABLE_NUMBER = {"type": ["number", "null"]}
BOOL = {"type": "boolean"}
STATUS = {"type": "string", "enum": ["pending", "delivering", "retrying", "delivered", "dead_letter"]}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(properties: dict[str, Any], required: list[str] | None = None, extra: bool = False) -> dict[str, Any]:
    """An object schema; answers list every property as required unless told otherwise."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": extra,
    }


DELIVERY = {
    "delivery_id": INT,
    "endpoint_id": INT,
    "endpoint_name": TEXT,
    "event_id": TEXT,
    "idempotency_key": TEXT,
    "event_type": TEXT,
    "status": STATUS,
    "attempts": INT,
    "max_attempts": INT,
    "replays": INT,
    "next_retry_at": NULLABLE_TIME,
    "last_http_status": NULLABLE_INT,
    "failure_category": NULLABLE_TEXT,
    "last_error": NULLABLE_TEXT,
    "dead_letter_reason": NULLABLE_TEXT,
    "priority": INT,
    "created_at": TIME,
    "delivered_at": NULLABLE_TIME,
    "dead_lettered_at": NULLABLE_TIME,
}
ATTEMPT = {
    "attempt": INT,
    "outcome": TEXT,
    "failure_category": NULLABLE_TEXT,
    "http_status": NULLABLE_INT,
    "latency_ms": NULLABLE_INT,
    "error": NULLABLE_TEXT,
    "response_excerpt": NULLABLE_TEXT,
    "worker_id": NULLABLE_TEXT,
    "stale": BOOL,
    "logged_at": TIME,
    "digest_id": {"type": ["integer", "null"], "description": "the digest that carried this attempt"},
    "digest": {"type": ["string", "null"], "description": "the digest as people name it: d-17"},
    "digest_rows": {"type": ["integer", "null"], "description": "how many rows the digest carried"},
}
# what only input is bound by (a stored value may come from SQL, which has its own CHECKs)
_INPUT_ONLY = {"default", "title", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
               "maxLength", "minItems", "maxItems", "pattern"}


def _as_read(schema: Any) -> Any:
    """A request field's schema as an answer carries it: its types and description."""
    if isinstance(schema, list):
        return [_as_read(s) for s in schema]
    if isinstance(schema, dict):
        return {k: _as_read(v) for k, v in schema.items() if k not in _INPUT_ONLY}
    return schema


# An endpoint as it is read: the service's fields (worker/endpoints.py, READABLE), as they are written,
# then what only the database knows.
_FIELDS = endpoint_service.EndpointFields.model_json_schema()["properties"]
ENDPOINT = {
    "id": INT,
    "name": TEXT,
    **{name: _as_read(_FIELDS[name]) for name in endpoint_service.READABLE},
    "url_display": {"type": "string", "description": "scheme, host and port only"},
    "active": BOOL,
    "disabled_reason": NULLABLE_TEXT,
    "secrets": INT,
    "tenant": TEXT,
    "health_status": NULLABLE_TEXT,
    "circuit_state": NULLABLE_TEXT,
    "circuit_open_until": NULLABLE_TIME,
    "consecutive_failures": NULLABLE_INT,
    "last_success_at": NULLABLE_TIME,
    "last_failure_at": NULLABLE_TIME,
    "created_at": TIME,
}
ENDPOINT_DETAIL = {
    **ENDPOINT,
    "queued": {"type": "object", "additionalProperties": INT},
    "recent_changes": {
        "type": "array",
        "items": obj(
            {
                "change": TEXT,
                "reason": NULLABLE_TEXT,
                "decided_by": NULLABLE_TEXT,
                "delivery_id": NULLABLE_INT,
                "at": TIME,
            }
        ),
    },
}
TENANT_LIMITS = {
    "rate_limit_per_second": {"type": ["number", "null"], "exclusiveMinimum": 0},
    "rate_limit_burst": {"type": ["integer", "null"], "minimum": 1, "maximum": INTEGER_MAX},
    "max_in_flight": {"type": ["integer", "null"], "minimum": 1, "maximum": INTEGER_MAX},
    "max_endpoints": {"type": ["integer", "null"], "minimum": 0, "maximum": INTEGER_MAX},
    "max_queued": {"type": ["integer", "null"], "minimum": 0, "maximum": BIGINT_MAX},
}
TENANT = {
    "id": INT,
    "name": TEXT,
    "rate_limit_per_second": {"type": ["number", "string", "null"]},
    "rate_limit_burst": NULLABLE_INT,
    "max_in_flight": NULLABLE_INT,
    "max_endpoints": NULLABLE_INT,
    "max_queued": NULLABLE_INT,
    "endpoints": INT,
    "waiting": INT,
    "in_flight": INT,
    "dead_letters": INT,
    "created_at": TIME,
}


def _self_service_schemas() -> dict[str, Any]:
    """worker/api/self_service.py's bodies and answers, written from their pydantic models."""
    from worker.api import self_service as s

    answers = (s.SigningSecrets, s.TestEventSent, s.EventTypeAnswer, s.EventTypeList, s.TokenList,
               s.TokenCreated, s.TokenRevoked)
    bodies = (s.EventTypeBody, s.DeprecateBody, s.TokenCreate)
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        *((m, "serialization") for m in answers), *((m, "validation") for m in bodies)]
    _, found = models_json_schema(models, ref_template="#/components/schemas/{model}")
    return dict(found["$defs"])


PAGE_NOTE = "Keyset pagination: pass `next_cursor` as `cursor` for the next page; null on the last."

SCHEMAS: dict[str, Any] = {
    "Problem": obj(
        {"type": TEXT, "title": TEXT, "status": INT, "detail": TEXT, "field": TEXT, "instance": TEXT},
        ["type", "title", "status"],
    ),
    "Caller": obj({"name": TEXT, "role": {"type": "string", "enum": list(ROLES)}}),
    "PublishRequest": obj(
        {
            "event_type": {"type": "string", "minLength": 1, "maxLength": 256},
            "payload": {"description": "any JSON value, sent as the body (at most max_payload_bytes)"},
            "endpoint": {
                "type": ["string", "integer"],
                "description": "name or id; absent: every subscriber",
            },
            "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 512},
            "ordering_key": {"type": "string", "minLength": 1, "maxLength": 512},
            "priority": {"type": "integer", "minimum": SMALLINT[0], "maximum": SMALLINT[1]},
            "expires_at": TIME,
        },
        ["event_type", "payload"],
    ),
    "PublishResponse": obj(
        {
            "idempotency_key": NULLABLE_TEXT,
            "created": BOOL,
            "deliveries": {
                "type": "array",
                "items": obj({"delivery_id": INT, "endpoint_id": INT, "endpoint_name": TEXT}),
            },
        }
    ),
    "Delivery": obj(DELIVERY),
    "DeliveryDetail": obj(
        {
            **DELIVERY,
            "payload": {},
            "source_ref": NULLABLE_TEXT,
            "attempts_history": {"type": "array", "items": ref("Attempt")},
        }
    ),
    "Attempt": obj(ATTEMPT),
    "DeliveryPage": obj({"items": {"type": "array", "items": ref("Delivery")}, "next_cursor": NULLABLE_TEXT}),
    "ReplayAccepted": obj({"delivery_id": INT, "status": {"const": "pending"}}),
    "BulkReplayRequest": obj(
        {
            "filter": obj(
                {
                    "endpoint": {"type": ["string", "integer"]},
                    "event_type": TEXT,
                    "category": CATEGORY,
                    "since": TIME,
                    "until": TIME,
                },
                [],
            ),
            "rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 100000},
            "max": {"type": "integer", "minimum": 1, "maximum": INTEGER_MAX},
        },
        [],
    ),
    "Operation": obj(
        {
            "id": INT,
            "kind": {"const": "replay_dead_letters"},
            "filter": {"type": "object"},
            "rate": NULLABLE_NUMBER,
            "max": NULLABLE_INT,
            "status": {"type": "string", "enum": ["running", "done", "failed", "cancelled"]},
            "processed": INT,
            "requested_by": TEXT,
            "cancelled_by": NULLABLE_TEXT,
            "error": NULLABLE_TEXT,
            "created_at": TIME,
            "updated_at": TIME,
            "finished_at": NULLABLE_TIME,
        }
    ),
    "Endpoint": obj(ENDPOINT),
    "EndpointDetail": obj(ENDPOINT_DETAIL),
    "EndpointCreated": obj({**ENDPOINT_DETAIL, "signing_secret": TEXT}),
    "EndpointPage": obj({"items": {"type": "array", "items": ref("Endpoint")}, "next_cursor": NULLABLE_TEXT}),
    # the request bodies are the service's models (worker/endpoints.py): their bounds are written once
    "EndpointCreate": endpoint_service.EndpointCreate.model_json_schema(),
    "EndpointPatch": endpoint_service.EndpointUpdate.model_json_schema(),
    "EndpointHealth": obj(
        {
            "id": INT,
            "name": TEXT,
            "active": BOOL,
            "health_status": NULLABLE_TEXT,
            "circuit_state": NULLABLE_TEXT,
            "circuit_open_until": NULLABLE_TIME,
            "consecutive_failures": NULLABLE_INT,
            "successes": NULLABLE_INT,
            "failures": NULLABLE_INT,
            "last_success_at": NULLABLE_TIME,
            "last_failure_at": NULLABLE_TIME,
            "window_hours": INT,
            "last_failure_category": NULLABLE_TEXT,
            "recent": {"type": "array", "items": obj({"outcome": TEXT, "category": TEXT, "attempts": INT})},
        }
    ),
    "CircuitRequest": obj(
        {"action": {"type": "string", "enum": ["reset", "open", "close"]}, "until": TIME}, ["action"]
    ),
    "CircuitResponse": obj({"endpoint_id": INT, "change": TEXT, "circuit_state": NULLABLE_TEXT}),
    "ReasonRequest": obj({"reason": {"type": "string", "minLength": 1, "maxLength": 1000}}, []),
    "ActiveResponse": obj({"endpoint_id": INT, "active": BOOL, "changed": BOOL}),
    "RotateRequest": obj(
        {"secret": TEXT, "expire_old_after_hours": {"type": "number", "exclusiveMinimum": 0}}, []
    ),
    "RotateResponse": obj(
        {"endpoint_id": INT, "signing_secret": TEXT, "active_secrets": INT, "old_expire_at": NULLABLE_TIME}
    ),
    "Stats": obj(
        {
            "queue": {
                "type": "array",
                "items": obj(
                    {"status": STATUS, "deliveries": INT, "oldest_due_age_seconds": NULLABLE_NUMBER},
                    ["status"],
                    extra=True,
                ),
            },
            "held_back": {"type": "array", "items": obj({"reason": TEXT, "rows": INT})},
        }
    ),
    "Tenant": obj(TENANT),
    "TenantList": obj({"items": {"type": "array", "items": ref("Tenant")}}),
    "TenantCreate": obj({"name": {"type": "string", "minLength": 1, "maxLength": 100}, **TENANT_LIMITS},
                        ["name"]),
    "TenantPatch": {**obj(dict(TENANT_LIMITS), []), "minProperties": 1},
    **_self_service_schemas(),
    "Config": {
        "type": "object",
        "description": "webhooks.delivery_config: every fleet-wide default",
        "properties": {"max_attempts": INT, "timeout_ms": INT, "lease_seconds": INT},
        "required": ["max_attempts", "timeout_ms", "lease_seconds"],
    },
    "ConfigPatch": {
        "type": "object",
        "minProperties": 1,
        "description": "settings to change, as `webhook-worker config set` names them",
    },
}

PROBLEM = {
    "description": "a problem document (RFC 9457)",
    "content": {"application/problem+json": {"schema": ref("Problem")}},
}
ID_PARAM = {"name": "id", "in": "path", "required": True, "schema": TEXT,
            "description": "all digits: the id; anything else: the name"}


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema or TEXT,
        "description": description,
    }


PAGE_PARAMS = [
    _query("cursor", "next_cursor of the previous page"),
    _query(
        "limit", "rows per page, 1 to 1000 (default 100)", {"type": "integer", "minimum": 1, "maximum": 1000}
    ),
]
TENANT_FILTER = _query("tenant", "that tenant's rows only (a token kept to a tenant: its own)")
FILTERS = [
    TENANT_FILTER,
    _query("endpoint", "endpoint name or id"),
    _query("event_type", "exact event type"),
    _query("category", "failure category", CATEGORY),
    _query("since", "RFC 3339 timestamp, inclusive", TIME),
    _query("until", "RFC 3339 timestamp, exclusive", TIME),
]


def _op(
    summary: str,
    roles: tuple[str, ...],
    answers: dict[int, str | None],
    body: str | None = None,
    params: list[dict[str, Any]] | None = None,
    body_required: bool = True,
) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, schema in answers.items():
        if schema is None:
            responses[str(status)] = {"description": "no content"}
        else:
            responses[str(status)] = {
                "description": summary,
                "content": {"application/json": {"schema": ref(schema)}},
            }
            if status in (201, 202):
                responses[str(status)]["headers"] = {"Location": {
                    "description": "where what was made can be read", "schema": TEXT}}
    for status in (401, 403, 429, 503):
        responses[str(status)] = PROBLEM
    if params or body:
        responses["422"] = PROBLEM
    if body:
        responses["400"] = PROBLEM
        responses["413"] = PROBLEM
        responses["415"] = PROBLEM
    operation: dict[str, Any] = {
        "summary": summary,
        "description": f"Roles: {', '.join(roles)}.",
        "x-roles": list(roles),
        "responses": responses,
        "security": [{"bearer": []}],
    }
    if params:
        operation["parameters"] = params
    if body:
        operation["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": ref(body)}},
        }
    return operation


def _not_found(operation: dict[str, Any]) -> dict[str, Any]:
    operation["responses"]["404"] = PROBLEM
    return operation


def _conflict(operation: dict[str, Any]) -> dict[str, Any]:
    operation["responses"]["409"] = PROBLEM
    return operation


READ = app_roles.READ
ADMIN = app_roles.ADMIN
FLEET_ADMIN = app_roles.FLEET_ADMIN


def _self_service_paths(endpoint: list[dict[str, Any]]) -> dict[str, Any]:
    """worker/api/self_service.py's routes."""
    type_name = [{"name": "name", "in": "path", "required": True, "schema": TEXT,
                  "description": "the event type"}]
    token = [{"name": "id", "in": "path", "required": True, "schema": TEXT,
              "description": "the token's name"}]
    return {
        "/v1/endpoints/{id}/secret": {
            "get": _not_found(_op("The secrets the endpoint's requests are signed with now, newest first "
                                  "(what its receiver verifies with); each read is logged", ADMIN,
                                  {200: "SigningSecrets"}, params=endpoint)),
        },
        "/v1/endpoints/{id}/test": {
            "post": _not_found(_op("Send a webhook.test event to this endpoint alone: 202 with its delivery",
                                   ADMIN, {202: "TestEventSent"}, params=endpoint)),
        },
        "/v1/event-types": {
            "get": _op("The event-type catalogue, and the caller's endpoints' subscriptions that match no "
                       "current type", READ, {200: "EventTypeList"}),
        },
        "/v1/event-types/{name}": {
            "get": _not_found(_op("An event type", READ, {200: "EventTypeAnswer"}, params=type_name)),
            "put": _op("Add an event type, or replace its description and schema (201: new)", FLEET_ADMIN,
                       {200: "EventTypeAnswer", 201: "EventTypeAnswer"}, "EventTypeBody", type_name),
        },
        "/v1/event-types/{name}/deprecate": {
            "post": _not_found(_op("Mark an event type deprecated (or, with deprecated false, current again)",
                                   FLEET_ADMIN, {200: "EventTypeAnswer"}, "DeprecateBody", type_name,
                                   body_required=False)),
        },
        "/v1/tokens": {
            "get": _op("API tokens (never the tokens themselves)", FLEET_ADMIN, {200: "TokenList"}),
            "post": _conflict(_op("Create a token: shown once, in this answer", FLEET_ADMIN,
                                  {201: "TokenCreated"}, "TokenCreate")),
        },
        "/v1/tokens/{id}/revoke": {
            "post": _not_found(_op("Revoke a token: it stops at once", FLEET_ADMIN, {200: "TokenRevoked"},
                                   params=token)),
        },
    }


@functools.cache
def document() -> dict[str, Any]:
    endpoint = [ID_PARAM]
    paths: dict[str, Any] = {
        "/v1/token": {
            "get": _op("The caller: the token's name and role", ROLES, {200: "Caller"})
        },
        "/v1/messages": {
            "post": _conflict(_op(
                "Publish an event: 202 with the deliveries queued; the same idempotency key again: 200 with "
                "the existing ones, or 409 when it was used for another event type or payload. "
                "A `traceparent` header is carried to the receiver.",
                app_roles.PUBLISH,
                {200: "PublishResponse", 202: "PublishResponse"},
                "PublishRequest",
                [{"name": "traceparent", "in": "header", "required": False, "schema": TEXT}],
            ))
        },
        "/v1/deliveries": {
            "get": _op(
                "Deliveries, newest first. " + PAGE_NOTE,
                READ,
                {200: "DeliveryPage"},
                params=[
                    _query("status", "delivery status", STATUS),
                    *FILTERS,
                    _query("idempotency_key", "every endpoint's delivery of this key"),
                    *PAGE_PARAMS,
                ],
            )
        },
        "/v1/deliveries/{id}": {
            "get": _not_found(
                _op("A delivery with every attempt", READ, {200: "DeliveryDetail"}, params=endpoint)
            )
        },
        "/v1/deliveries/{id}/replay": {
            "post": _conflict(
                _not_found(
                    _op(
                        "Send a dead letter or delivered row again (same webhook-id); 409 when it is neither",
                        ADMIN,
                        {202: "ReplayAccepted"},
                        params=endpoint,
                    )
                )
            )
        },
        "/v1/dead-letters": {
            "get": _op(
                "Dead letters, oldest first. " + PAGE_NOTE,
                READ,
                {200: "DeliveryPage"},
                params=[*FILTERS, *PAGE_PARAMS],
            )
        },
        "/v1/dead-letters/replay": {
            "post": _op(
                "Replay every dead letter matching the filter, in resumable steps: 202 with the operation",
                ADMIN,
                {202: "Operation"},
                "BulkReplayRequest",
            )
        },
        "/v1/operations/{id}": {
            "get": _not_found(_op("A bulk operation's progress", READ, {200: "Operation"}, params=endpoint))
        },
        "/v1/operations/{id}/cancel": {
            "post": _conflict(_not_found(_op(
                "Stop a running operation after the step it is in (again: 200; already done or failed: 409)",
                ADMIN, {200: "Operation"}, params=endpoint)))
        },
        "/v1/endpoints": {
            "get": _op("Endpoints by id. " + PAGE_NOTE, READ, {200: "EndpointPage"},
                       params=[TENANT_FILTER, *PAGE_PARAMS]),
            "post": _conflict(
                _op(
                    "Register an endpoint (the CLI's destination, header and sealing rules); "
                    "the signing secret is shown once",
                    ADMIN,
                    {201: "EndpointCreated"},
                    "EndpointCreate",
                )
            ),
        },
        "/v1/endpoints/{id}": {
            "get": _not_found(
                _op("An endpoint, by id or name", READ, {200: "EndpointDetail"}, params=endpoint)
            ),
            "patch": _conflict(
                _not_found(
                    _op(
                        "Change an endpoint's settings",
                        ADMIN,
                        {200: "EndpointDetail"},
                        "EndpointPatch",
                        endpoint,
                    )
                )
            ),
            "delete": _conflict(
                _not_found(
                    _op(
                        "Delete an endpoint with no deliveries left in the queue",
                        ADMIN,
                        {204: None},
                        params=endpoint,
                    )
                )
            ),
        },
        "/v1/endpoints/{id}/health": {
            "get": _not_found(
                _op(
                    "Circuit state and recent attempts by outcome and category",
                    READ,
                    {200: "EndpointHealth"},
                    params=[*endpoint, _query("hours", "window, 1 to 744 (default 24)", {"type": "integer"})],
                )
            )
        },
        "/v1/endpoints/{id}/circuit": {
            "post": _not_found(
                _op(
                    "Reset, open (until a time) or close the circuit",
                    ADMIN,
                    {200: "CircuitResponse"},
                    "CircuitRequest",
                    endpoint,
                )
            )
        },
        "/v1/endpoints/{id}/enable": {
            "post": _not_found(
                _op(
                    "Enable (and reset the circuit); queued rows are sent",
                    ADMIN,
                    {200: "ActiveResponse"},
                    params=endpoint,
                )
            )
        },
        "/v1/endpoints/{id}/disable": {
            "post": _not_found(
                _op(
                    "Disable: no new deliveries, queued rows wait",
                    ADMIN,
                    {200: "ActiveResponse"},
                    "ReasonRequest",
                    endpoint,
                    body_required=False,
                )
            )
        },
        "/v1/endpoints/{id}/rotate-secret": {
            "post": _not_found(
                _op(
                    "Add a new signing secret (shown once); the old ones stay until expire_old_after_hours",
                    ADMIN,
                    {200: "RotateResponse"},
                    "RotateRequest",
                    endpoint,
                    body_required=False,
                )
            )
        },
        "/v1/tenants": {
            "get": _op("Tenants, their limits (null: none) and rows", FLEET_ADMIN, {200: "TenantList"}),
            "post": _conflict(_op("Add a tenant", FLEET_ADMIN, {201: "Tenant"}, "TenantCreate")),
        },
        "/v1/tenants/{id}": {
            "get": _not_found(_op("A tenant, by name or id", FLEET_ADMIN, {200: "Tenant"}, params=endpoint)),
            "patch": _not_found(_op("Change a tenant's limits; null clears one", FLEET_ADMIN, {200: "Tenant"},
                                    "TenantPatch", params=endpoint)),
        },
        "/v1/stats": {
            "get": _op("Queue by status, oldest due, rows held back and why", READ, {200: "Stats"})
        },
        "/v1/config": {
            "get": _op("The fleet-wide defaults", app_roles.FLEET_READ, {200: "Config"}),
            "patch": _op(
                "Change fleet-wide defaults (workers pick them up)", FLEET_ADMIN, {200: "Config"},
                "ConfigPatch"),
        },
        **_self_service_paths(endpoint),
    }
    # every POST and PATCH reads its body, even those that take none (they refuse one that is not `{}`);
    # 408: the body did not arrive within api.body_timeout_seconds
    body_problems = {"400": PROBLEM, "408": PROBLEM, "413": PROBLEM, "415": PROBLEM, "422": PROBLEM}
    for item in paths.values():
        for method in ("post", "patch"):
            if method in item:
                item[method]["responses"].update(body_problems)
    paths["/v1/openapi.json"] = {
        "get": {
            "summary": "This document (no token needed)",
            "security": [],
            "responses": {
                "200": {
                    "description": "OpenAPI 3.1",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "webhook-worker API",
            "version": __version__,
            "description": "Publish events, follow deliveries, replay dead letters and manage endpoints. "
            "Errors are RFC 9457 problem documents naming the field and the problem.",
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a token from `webhook-worker tokens create`",
                }
            },
        },
    }
