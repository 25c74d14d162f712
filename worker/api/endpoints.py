"""Endpoint registration and changes over HTTP: the CLI's rules, fields named as the API names them."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, field_validator

from worker import coalescing, signing
from worker.api.inputs import INTEGER_MAX, NAME_PATTERN, Body, some_field_given
from worker.api.problems import Problem, invalid
from worker.config import Config
from worker.delivery import display_url
from worker.destinations import DestinationPolicy, address_blocked, ip_literal
from worker.operations import EndpointSpec
from worker.policy import MAX_DELAY_SECONDS, RetrySchedule
from worker.registration import (
    MAX_ENDPOINT_NAME_CHARS,
    MAX_URL_CHARS,
    endpoint_name_problem,
    header_problem,
    headers_problem,
    registration_url_problem,
)

BodyFormat = Literal["raw", "envelope", "slack", "mattermost", "pagerduty"]
# What the OpenAPI document says of these fields, beyond their types (the checks are
# worker.registration's, worker.signing's and RetrySchedule's; the destination rules that depend on
# the configuration and on DNS are not in it)
URL_SCHEMA: dict[str, Any] = {"maxLength": MAX_URL_CHARS, "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^/?#]+",
                              "description": "http(s) URL; kept sealed, never shown again"}
SECRET_SCHEMA: dict[str, Any] = {"description": "whsec_<base64>; default: generated"}
DELAYS_SCHEMA: dict[str, Any] = {"items": {"type": "number", "minimum": 0, "maximum": MAX_DELAY_SECONDS}}
MAX_TTL_SECONDS = 365 * 86400


class EndpointFields(Body):
    """What POST and PATCH share; every field optional here, POST requires name and url."""

    url: str | None = Field(default=None, min_length=1, repr=False, json_schema_extra=URL_SCHEMA)
    event_types: list[str] | None = Field(default=None, min_length=1, max_length=100)
    headers: dict[str, str] | None = Field(default=None, repr=False)
    max_attempts: int | None = Field(default=None, ge=1, le=100)
    timeout_seconds: float | None = Field(default=None, ge=0.1, le=300)
    retry_delays: list[float] | None = Field(default=None, min_length=1, max_length=100,
                                             json_schema_extra=DELAYS_SCHEMA)
    rate_limit: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1, le=INTEGER_MAX)
    max_in_flight: int | None = Field(default=None, ge=1, le=INTEGER_MAX)
    format: BodyFormat | None = None
    routing_key: str | None = Field(default=None, min_length=1, repr=False)
    ttl_seconds: float | None = Field(default=None, gt=0, le=MAX_TTL_SECONDS)
    coalesce_max: int | None = Field(default=None, ge=0, le=coalescing.MAX_COALESCE)
    coalesce_window: float | None = Field(default=None, ge=0, le=coalescing.MAX_WINDOW_SECONDS)
    # every tenant's operational events: an operator's setting, never a tenant's (refuse_scoped below)
    operational_all_tenants: bool | None = None

    @field_validator("event_types")
    @classmethod
    def _event_types(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not t.strip() for t in value):
            raise ValueError("an event type must not be empty")
        return value

    @field_validator("retry_delays")
    @classmethod
    def _delays(cls, value: list[float] | None) -> list[float] | None:
        if value is not None:
            RetrySchedule.from_json({"delays": value}, 0.0)
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, content in (value or {}).items():
            problem = header_problem(name, content)
            if problem is not None:
                raise ValueError(problem)
        return value


class EndpointCreate(EndpointFields):
    name: str = Field(min_length=1, max_length=MAX_ENDPOINT_NAME_CHARS,
                      json_schema_extra={"pattern": NAME_PATTERN})
    url: str = Field(min_length=1, repr=False, json_schema_extra=URL_SCHEMA)
    secret: str | None = Field(default=None, repr=False, json_schema_extra=SECRET_SCHEMA)
    verify: Literal[False] = False  # the challenge is the CLI's (`endpoints add --verify`)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = endpoint_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class EndpointPatch(EndpointFields):
    model_config = ConfigDict(json_schema_extra=some_field_given)


class SecretRotation(Body):
    secret: str | None = Field(default=None, repr=False, json_schema_extra=SECRET_SCHEMA)
    expire_old_after_hours: float | None = Field(default=None, gt=0, le=24 * 365)


def refuse_scoped(body: EndpointFields, tenant_id: int | None) -> None:
    """A caller kept to one tenant never marks an endpoint for every tenant's operational events
    (SQL refuses it too for a session scoped to a tenant: the trigger refuse_scoped_all_tenants).
    Only admin tokens reach these routes, and they are never scoped today; a tenant admin would be."""
    if body.operational_all_tenants and tenant_id is not None:
        raise Problem(403, "forbidden", "The token may not do this",
                      "operational_all_tenants: a token scoped to a tenant cannot mark an endpoint for "
                      "every tenant's operational events", field="operational_all_tenants")


def check_secret(secret: str, field: str = "secret") -> None:
    problem = signing.secret_problem(secret)
    if problem is not None:
        raise invalid(field, problem)


def policy(config: Config) -> DestinationPolicy:
    security = config.security
    return DestinationPolicy.from_settings(security.block_private_networks, security.allow_networks,
                                           security.require_https)


async def check_url(url: str, config: Config) -> None:
    """The CLI's destination rules: the URL's form, an IP literal, or a name resolving only to
    refused addresses now (a name that does not resolve yet is accepted: deliveries fail as `dns`)."""
    rules = policy(config)
    problem = registration_url_problem(url, rules)
    if problem is not None:
        raise invalid("url", problem)
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ip_literal(host) is not None:
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, parts.port or 443, type=socket.SOCK_STREAM)
    except UnicodeError:  # the host cannot be written as a DNS name (IDNA): it can never resolve
        raise invalid("url", "the host is not a valid domain name") from None
    except OSError:
        return
    reasons = [address_blocked(str(info[4][0]), rules) for info in infos]
    if reasons and all(reasons):
        raise invalid("url", f"{host} resolves to a refused address: {reasons[0]} (security.allow_networks "
                             "lists networks to allow)")


def check_routing_key(body_format: str | None, routing_key: str | None, stored_format: str | None = None,
                      stored_key: bool = False) -> None:
    effective = body_format or stored_format
    if routing_key is not None and effective != "pagerduty":
        raise invalid("routing_key", f"only with format pagerduty (the format is {effective or 'raw'})")
    if body_format == "pagerduty" and routing_key is None and not stored_key:
        raise invalid("routing_key", "required with format pagerduty")


def spec(body: EndpointCreate, secret: str) -> EndpointSpec:
    problem = headers_problem(body.url, body.headers or {})
    if problem is not None:
        raise invalid("headers", problem)
    return EndpointSpec(
        name=body.name, url=body.url, url_display=display_url(body.url), signing_secrets=(secret,),
        event_types=tuple(body.event_types or ["*"]), headers=body.headers or {},
        max_attempts=body.max_attempts,
        timeout_ms=int(body.timeout_seconds * 1000) if body.timeout_seconds else None,
        retry_schedule={"delays": body.retry_delays} if body.retry_delays else None,
        rate_limit_per_second=body.rate_limit, rate_limit_burst=body.burst, max_in_flight=body.max_in_flight,
        body_format=body.format or "raw",
        secret_settings={"routing_key": body.routing_key} if body.routing_key else {},
        operational_all_tenants=bool(body.operational_all_tenants),
    )


def coalescing_changes(body: EndpointFields, body_format: str | None, stored_max: int | None = None
                       ) -> dict[str, Any]:
    """webhooks.update_endpoint's fields for coalesce_max / coalesce_window (0 turns coalescing off),
    checked by the CLI's rules; `body_format` is the endpoint's format after the change."""
    try:
        return coalescing.policy_changes(body.coalesce_max, body.coalesce_window, body_format, stored_max)
    except ValueError as exc:
        # the rules name the CLI's options; the API names its fields
        option, _, detail = str(exc).partition(": ")
        field = {"--coalesce-max": "coalesce_max", "--coalesce-window": "coalesce_window"}.get(
            option, option.removeprefix("--").partition(" ")[0])
        for cli, api in (("--coalesce-max", "coalesce_max"), ("--coalesce-window", "coalesce_window")):
            detail = detail.replace(cli, api)
        raise invalid(field, detail) from None


def changes(body: EndpointFields) -> dict[str, Any]:
    """webhooks.update_endpoint's fields for what a PATCH gives (the routing key apart)."""
    found: dict[str, Any] = {}
    if body.url is not None:
        found["url"] = body.url
        found["url_display"] = display_url(body.url)
    if body.event_types is not None:
        found["event_types"] = body.event_types
    if body.headers is not None:
        found["headers"] = body.headers
    for field, column in (("max_attempts", "max_attempts"), ("rate_limit", "rate_limit_per_second"),
                          ("burst", "rate_limit_burst"), ("max_in_flight", "max_in_flight"),
                          ("format", "body_format"), ("operational_all_tenants", "operational_all_tenants")):
        if getattr(body, field) is not None:
            found[column] = getattr(body, field)
    if body.timeout_seconds is not None:
        found["timeout_ms"] = int(body.timeout_seconds * 1000)
    if body.retry_delays is not None:
        found["retry_schedule"] = {"delays": body.retry_delays}
    if body.ttl_seconds is not None:
        found["delivery_ttl"] = f"{body.ttl_seconds} seconds"
    return found
