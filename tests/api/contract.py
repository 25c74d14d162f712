"""Every answer the tests receive from /v1, checked against the OpenAPI document."""

from __future__ import annotations

import re
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from worker.api.openapi import document

BASE = "urn:webhook-worker:openapi"


def _registry() -> Registry[Any]:
    return Registry().with_resource(BASE, Resource(contents=document(), specification=DRAFT202012))


_ROUTES = [
    (re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), path) for path in document()["paths"]
]


def template(path: str) -> str | None:
    path = path.split("?", 1)[0]
    # literal paths first (/v1/dead-letters/replay before /v1/deliveries/{id})
    for pattern, name in sorted(_ROUTES, key=lambda r: r[1].count("{")):
        if pattern.match(path):
            return name
    return None


def problems(method: str, path: str, status: int, content_type: str, body: Any) -> list[str]:
    """What in this answer the document does not describe; empty when it conforms."""
    name = template(path)
    operation = None if name is None else document()["paths"][name].get(method.lower())
    if operation is None:
        # a route or method that does not exist: the document cannot list it, the answer is a problem
        if status in (404, 405) and content_type.startswith("application/problem+json"):
            return _errors(body, "#/components/schemas/ProblemDocument", f"{method} {path} {status}")
        return [f"{method} {path}: no such operation in the document"]
    response = operation["responses"].get(str(status))
    if response is None:
        return [f"{method} {name}: status {status} is not documented"]
    if "$ref" in response:  # a problem document shared by the routes (#/components/responses/...)
        shared = response["$ref"].removeprefix("#/components/responses/")
        response = document()["components"]["responses"][shared]
        media = content_type.split(";")[0].strip()
        if media not in response["content"]:
            return [f"{method} {name} {status}: content type {media} is not documented"]
        return _errors(body, "#/components/responses/" + shared + "/content/"
                       + media.replace("/", "~1") + "/schema", f"{method} {name} {status}")
    if "content" not in response:
        return [] if not body else [f"{method} {name} {status}: documented without a body"]
    media = content_type.split(";")[0].strip()
    if media not in response["content"]:
        return [f"{method} {name} {status}: content type {media} is not documented"]
    pointer = "/".join(
        part.replace("~", "~0").replace("/", "~1")
        for part in ("#", "paths", name, method.lower(), "responses", str(status), "content", media)
    )
    return _errors(body, pointer + "/schema", f"{method} {name} {status}")


def _errors(body: Any, pointer: str, where: str) -> list[str]:
    validator = Draft202012Validator(
        {"$ref": BASE + pointer}, registry=_registry(), format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    return [f"{where}: {error.json_path}: {error.message}" for error in validator.iter_errors(body)]
