"""The OpenAPI 3.1 document of /v1, written from the routes' declarations and their pydantic models
(`python -m worker.api.openapi` prints it; docs/openapi.json is that output, committed)."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue, models_json_schema
from pydantic_core import core_schema

from worker import __version__
from worker.api.answers import ProblemDocument
from worker.api.declare import Route
from worker.api.inputs import MAX_ID, NO_CONTROL
from worker.api.routes import ROUTES
from worker.api.serving import MAX_HEADER_BYTES, MAX_HEADERS, MAX_REQUEST_LINE_BYTES

REF = "#/components/schemas/{model}"
ID = {"type": "integer", "minimum": 1, "maximum": MAX_ID}
PATH_IDS: dict[str, dict[str, Any]] = {
    "id": {"schema": ID, "description": "the id"},
    "ref": {"schema": {"anyOf": [ID, {"type": "string", "minLength": 1, "pattern": NO_CONTROL}]},
            "description": "all digits: the id; anything else: the name"},
    "name": {"schema": {"type": "string", "minLength": 1, "pattern": NO_CONTROL}, "description": "the name"},
}
PROBLEM = {"description": "a problem document (RFC 9457)",
           "content": {"application/problem+json": {"schema": {"$ref": REF.format(model="ProblemDocument")}}}}
# What an error answer means, for each status a route may answer besides its own
ERRORS = {
    400: "the body is not JSON",
    401: "no valid token",
    403: "the token's role may not call this route",
    404: "nothing with this id or name",
    408: "the body did not arrive within api.body_timeout_seconds",
    409: "the current state refuses this",
    413: "the body exceeds api.max_body_bytes (or the payload max_payload_bytes)",
    414: f"the request's path and query exceed {MAX_REQUEST_LINE_BYTES} bytes (the connection closes)",
    415: "the body is not sent as application/json",
    422: "a field, parameter or header is invalid: the problem names it",
    429: "too many failed authentications from this address (or the tenant's queue is full)",
    431: f"a header's name and value exceed {MAX_HEADER_BYTES} bytes, or there are more than {MAX_HEADERS} "
         "headers (the connection closes)",
    503: "the database is unreachable (or the API has no encryption keys, or a publish's schema checks "
         "could not run)",
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}}
ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    429: RETRY_AFTER,
    503: RETRY_AFTER,
}


class Schemas(GenerateJsonSchema):
    """pydantic's JSON Schema, without a title per field and without `default: null` on a field that
    cannot be null (left out is how it is not given)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        result = super().default_schema(schema)
        if result.get("default", ...) is None and not _nullable(result):
            del result["default"]
        return result


def _nullable(schema: dict[str, Any]) -> bool:
    kinds = schema.get("type")
    return (kinds == "null" or (isinstance(kinds, list) and "null" in kinds)
            or any(_nullable(option) for option in schema.get("anyOf", [])) or "$ref" in schema)


def _models(routes: list[Route]) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    found: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {(ProblemDocument, "serialization"): None}
    for route in routes:
        if route.body is not None:
            found[(route.body, "validation")] = None
        for model in route.answers.values():
            if model is not None:
                found[(model, "serialization")] = None
    return list(found)


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional query parameter's schema: absent is how it is left out, never null."""
    options = schema.get("anyOf")
    if options is None:
        return schema
    kept = [option for option in options if option != {"type": "null"}]
    rest = {key: value for key, value in schema.items() if key not in ("anyOf", "default")}
    return {**rest, **kept[0]} if len(kept) == 1 else {**rest, "anyOf": kept}


def _parameters(route: Route) -> list[dict[str, Any]]:
    parameters: list[dict[str, Any]] = []
    if route.path_id is not None:
        name = "name" if route.path_id == "name" else "id"
        parameters.append({"name": name, "in": "path", "required": True, **PATH_IDS[route.path_id]})
    query = route.query.model_json_schema(ref_template=REF, schema_generator=Schemas)
    for name, schema in query.get("properties", {}).items():
        description = schema.pop("description", None)
        schema.pop("title", None)
        parameter = {"name": name, "in": "query", "required": name in query.get("required", []),
                     "schema": _without_null(schema)}
        if description:
            parameter["description"] = description
        parameters.append(parameter)
    for header in route.headers:
        parameters.append({"name": header.name, "in": "header", "required": False, "schema": header.schema,
                           "description": header.description})
    return parameters


def _responses(route: Route, refs: dict[Any, Any]) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, model in route.answers.items():
        if model is None:
            responses[str(status)] = {"description": "no content"}
            continue
        answer: dict[str, Any] = {"description": route.summary,
                                  "content": {"application/json": {"schema": refs[(model, "serialization")]}}}
        if status in (201, 202):
            answer["headers"] = {"Location": {"description": "where what was made can be read",
                                              "schema": {"type": "string"}}}
        responses[str(status)] = answer
    # every route refuses a query parameter it does not know, and a request head too large to read
    errors = set(route.refusals) | {414, 422, 431}
    if not route.public:
        errors |= {401, 403, 429, 503}
    if route.takes_body:
        errors |= {400, 408, 413, 415}
    for status in sorted(errors):
        responses[str(status)] = {"$ref": f"#/components/responses/Problem{status}"}
    return responses


def _problem_responses() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for status, meaning in ERRORS.items():
        found[f"Problem{status}"] = {**PROBLEM, "description": meaning}
        if status in ERROR_HEADERS:
            found[f"Problem{status}"]["headers"] = ERROR_HEADERS[status]
    return found


def build(routes: list[Route]) -> dict[str, Any]:
    """The document for these routes."""
    refs, definitions = models_json_schema(_models(routes), ref_template=REF, schema_generator=Schemas)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "operationId": route.handler.__name__,
            "summary": route.summary,
            "responses": _responses(route, refs),
        }
        if route.public:
            operation["security"] = []
        else:
            operation["description"] = f"Roles: {', '.join(route.roles)}."
            operation["x-roles"] = list(route.roles)
            operation["security"] = [{"bearer": []}]
        parameters = _parameters(route)
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            operation["requestBody"] = {
                "required": route.body_required,
                "content": {"application/json": {"schema": refs[(route.body, "validation")]}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
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
            "schemas": definitions.get("$defs", {}),
            "responses": _problem_responses(),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "a token from `webhook-worker tokens create`"},
            },
        },
    }


@functools.cache
def document() -> dict[str, Any]:
    """The document of the API's routes (served at /v1/openapi.json, from app[DOCUMENT])."""
    return build(ROUTES)


def text() -> str:
    """The document as docs/openapi.json holds it."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(text())
