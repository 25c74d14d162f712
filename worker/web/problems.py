"""RFC 9457 problem documents: every error the API answers, naming the field and the problem."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

PROBLEM_CONTENT_TYPE = "application/problem+json"
# Relative type URIs: documented in docs/reference/http-api.md ("Errors"), stable for clients to switch on.
TYPE_BASE = "/v1/problems/"
# On every answer (the console sets its own, stricter set): an answer may carry a caller's data, so
# no cache keeps it, and a browser must not read a JSON document as HTML or script.
ANSWER_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


class Problem(Exception):
    """An error answer. Raised anywhere in a handler; the middleware turns it into the document."""

    def __init__(self, status: int, kind: str, title: str, detail: str | None = None,
                 field: str | None = None, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(detail or title)
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.field = field
        self.headers = headers or {}
        self.extra = extra

    def document(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"type": TYPE_BASE + self.kind, "title": self.title, "status": self.status}
        if self.detail is not None:
            body["detail"] = self.detail
        if self.field is not None:
            body["field"] = self.field
        if instance is not None:
            body["instance"] = instance
        body.update(self.extra)
        return body

    def response(self, instance: str | None = None) -> web.Response:
        return web.Response(status=self.status, body=orjson.dumps(self.document(instance)),
                            content_type=PROBLEM_CONTENT_TYPE, headers=self.headers)


def invalid(field: str, detail: str) -> Problem:
    """A field of the request (body, query or path) that cannot be used: 422 naming it."""
    return Problem(422, "invalid-field", "A field is invalid", f"{field}: {detail}", field=field)


def unsupported_media_type(given: str) -> Problem:
    return Problem(415, "unsupported-media-type", "The body is not JSON",
                   f"Content-Type {given or '(none)'}: expected application/json")


def bad_request(detail: str, kind: str = "bad-request") -> Problem:
    return Problem(400, kind, "The request cannot be read", detail)


def not_found(what: str) -> Problem:
    return Problem(404, "not-found", "Not found", f"{what}: not found")


def conflict(detail: str, field: str | None = None) -> Problem:
    return Problem(409, "conflict", "The current state refuses this", detail, field=field)


def unauthorized(detail: str) -> Problem:
    # The challenge tells clients which scheme to use (RFC 9110, 11.6.1).
    return Problem(401, "unauthorized", "Authentication required", detail,
                   headers={"WWW-Authenticate": 'Bearer realm="webhook-worker"'})


def forbidden(role: str, allowed: tuple[str, ...]) -> Problem:
    return Problem(403, "forbidden", "The token's role may not do this",
                   f"role {role} may not use this route; it needs {' or '.join(allowed)}")


def refused(status: int, kind: str, title: str, detail: str, retry_after: int | None = None) -> Problem:
    """A request a limit or the state refuses, with `Retry-After` when waiting may help."""
    headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
    return Problem(status, kind, title, detail, headers=headers)


def too_many_failed_authentications(retry_after: int) -> Problem:
    return Problem(429, "too-many-failed-authentications", "Too many failed authentications",
                   f"this address failed to authenticate too often; try again in {retry_after} s",
                   headers={"Retry-After": str(retry_after)})
