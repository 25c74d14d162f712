"""Endpoints: the one shape an endpoint is read and written in (pydantic models holding every bound
once), and the rules a registration or a change must pass before worker.store.endpoints stores it;
the CLI, the HTTP API and the console all call these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.config import Config
from worker.rules import coalescing, formats, wording
from worker.rules import tenants as tenant_rules
from worker.rules.classification import MAX_DELAY_SECONDS, RetrySchedule
from worker.rules.destinations import (
    Address,
    DestinationRules,
    address_blocked,
    ip_literal,
    refused_as_private,
    tenant_destinations,
)
from worker.rules.redaction import display_url
from worker.rules.registration import (
    MAX_ENDPOINT_NAME_CHARS,
    MAX_URL_CHARS,
    endpoint_name_problem,
    header_problem,
    registration_url_problem,
)

BODY_FORMATS = formats.FORMATS  # what the renderer can write: the one list
INTEGER_MAX = 2**31 - 1
# The subscription of an endpoint that names none: every event type but the worker's own (webhook.*),
# as webhooks.register_endpoint() has it.
EVERY_EVENT_TYPE = ("*",)
MAX_TTL_SECONDS = 365 * 86400
MAX_DESCRIPTION_CHARS = 1000
# Why an operator disabled an endpoint or acted on its circuit: recorded with the change (the API's
# ReasonBody and the console's forms both hold to it).
MAX_REASON_CHARS = 1000

# A field whose column differs in name or unit: how the column reads as the field (SQL over
# webhooks.endpoint_summary), and how the field is written to it (webhooks.update_endpoint's fields).
# Every other field is its column, as it is.
READS = {
    "timeout_seconds": "(timeout_ms / 1000.0)::float8",
    "retry_delays": "retry_schedule -> 'delays'",
    "rate_limit_per_second": "rate_limit_per_second::float8",  # numeric: a number, not a text
    "ttl_seconds": "extract(epoch FROM delivery_ttl)::float8",
    "coalesce_window": "extract(epoch FROM coalesce_window)::float8",
}
WRITES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "timeout_seconds": ("timeout_ms", lambda seconds: round(seconds * 1000)),
    "retry_delays": ("retry_schedule", lambda delays: {"delays": delays}),
    "ttl_seconds": ("delivery_ttl", lambda seconds: f"{seconds} seconds"),
}
# Written and never read back: credentials.
WRITE_ONLY = frozenset({"url", "headers", "routing_key", "secret"})
# Written through rules of their own (sealing, the routing-key and coalescing rules).
OWN_RULES = frozenset({"url", "routing_key", "coalesce_max", "coalesce_window"})
# Read, never written through these models (the model accepts and ignores them: a read endpoint can
# be sent back as it is).
READ_ONLY_COLUMNS = ("url_display", "active", "disabled_reason", "secrets", "tenant", "health_status",
                     "circuit_state", "circuit_open_until", "consecutive_failures", "last_success_at",
                     "last_failure_at", "created_at")


class EndpointProblem(Exception):
    """A field that cannot be used (`conflict`: it clashes with what is stored, e.g. a name taken);
    the detail never contains a credential."""

    def __init__(self, field: str, detail: str, conflict: bool = False, hint: str = "") -> None:
        super().__init__(f"{field}: {detail}")
        self.field, self.detail, self.conflict, self.hint = field, detail, conflict, hint


class _Model(BaseModel):
    """Unknown fields refused, types not coerced (a number is not a string)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


def _read_only() -> Any:
    return Field(default=None, exclude=True, json_schema_extra={"readOnly": True})


# What the OpenAPI document says of these fields beyond their types (the checks themselves are
# worker.rules.registration's and RetrySchedule's; the destination rules, which depend on the configuration
# and on DNS, are not in it)
URL_SCHEMA: dict[str, Any] = {"maxLength": MAX_URL_CHARS, "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^/?#]+"}
DELAYS_SCHEMA: dict[str, Any] = {"items": {"type": "number", "minimum": 0, "maximum": MAX_DELAY_SECONDS}}


class EndpointFields(_Model):
    """What registration and a change share: every field optional (a change sets what it gives)."""

    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS,
                                    description="free text for people; an empty string clears it")
    # its length is checked by registration_url_problem (a message that says how long it is)
    url: str | None = Field(default=None, min_length=1, repr=False,
                            json_schema_extra=URL_SCHEMA,
                            description="kept sealed; never shown again")
    event_types: list[str] | None = Field(default=None, min_length=1, max_length=100,
                                          description="subscriptions; '*' is every event type")
    headers: dict[str, str] | None = Field(default=None, repr=False,
                                           description="custom request headers (kept sealed)")
    max_attempts: int | None = Field(default=None, ge=1, le=100,
                                     description="override the global max attempts")
    timeout_seconds: float | None = Field(default=None, ge=0.1, le=300, description="request timeout")
    retry_delays: list[float] | None = Field(default=None, min_length=1, max_length=100,
                                             json_schema_extra=DELAYS_SCHEMA,
                                             description="retry delays in seconds")
    rate_limit_per_second: float | None = Field(
        default=None, gt=0, validation_alias=AliasChoices("rate_limit_per_second", "rate_limit"),
        description="at most this many requests per second, fleet-wide")
    rate_limit_burst: int | None = Field(
        default=None, ge=1, le=INTEGER_MAX, validation_alias=AliasChoices("rate_limit_burst", "burst"),
        description="requests allowed at once above the rate")
    max_in_flight: int | None = Field(default=None, ge=1, le=INTEGER_MAX,
                                      description="at most this many requests open at once, fleet-wide")
    body_format: str | None = Field(
        default=None, validation_alias=AliasChoices("body_format", "format"),
        json_schema_extra={"enum": [*BODY_FORMATS, None]},
        description="request body: the payload as queued (raw), the Standard Webhooks envelope, or a "
                    "Slack, Mattermost or PagerDuty Events v2 message")
    routing_key: str | None = Field(default=None, repr=False, json_schema_extra={"minLength": 1},
                                    description="PagerDuty integration key (with body_format pagerduty)")
    ttl_seconds: float | None = Field(default=None, gt=0, le=MAX_TTL_SECONDS,
                                      description="deliveries not delivered within this long expire")
    coalesce_max: int | None = Field(
        default=None, ge=0, le=coalescing.MAX_COALESCE,
        description="send up to N due rows as one digest request (slack, mattermost, envelope); 0 turns "
                    "coalescing off")
    coalesce_window: float | None = Field(
        default=None, ge=0, le=coalescing.MAX_WINDOW_SECONDS,
        description="seconds; with coalesce_max: also coalesce once the oldest due row waited this long")
    operational_all_tenants: bool | None = Field(
        default=None, description="receive the operational events (webhook.*) of every tenant's "
                                  "endpoints, not only of its own tenant's (the operator's channel)")
    # read-only: accepted and ignored
    id: Any = _read_only()
    url_display: Any = _read_only()
    active: Any = _read_only()
    disabled_reason: Any = _read_only()
    secrets: Any = _read_only()
    tenant: Any = _read_only()
    health_status: Any = _read_only()
    circuit_state: Any = _read_only()
    circuit_open_until: Any = _read_only()
    consecutive_failures: Any = _read_only()
    last_success_at: Any = _read_only()
    last_failure_at: Any = _read_only()
    created_at: Any = _read_only()
    queued: Any = _read_only()
    recent_changes: Any = _read_only()

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

    @field_validator("body_format")
    @classmethod
    def _body_format(cls, value: str | None) -> str | None:
        if value is not None and value not in BODY_FORMATS:
            raise ValueError(f"one of {', '.join(BODY_FORMATS)}")
        return value

    @field_validator("routing_key")
    @classmethod
    def _routing_key(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("description")
    @classmethod
    def _description(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("\n", " ").isprintable():
            raise ValueError("must be printable text")
        return value


class EndpointCreate(EndpointFields):
    # not all digits: endpoint_name_problem says so in words (the pattern is for the document)
    name: str = Field(min_length=1, max_length=MAX_ENDPOINT_NAME_CHARS, json_schema_extra={"pattern": r"\D"},
                      description="unique within its tenant; not all digits (an all-digit ENDPOINT always "
                                  "means an id)")
    url: str = Field(min_length=1, repr=False, json_schema_extra=URL_SCHEMA,
                     description="kept sealed; never shown again")
    secret: str | None = Field(default=None, repr=False, description="whsec_<base64>; default: generated")
    # written once, at registration (what an endpoint's answer says can be sent back)
    tenant: str | None = Field(default=None, min_length=1, max_length=tenant_rules.MAX_NAME,
                               description="the tenant it belongs to (default: default); a token kept "
                                           "to a tenant registers in its own only")

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str | None) -> str | None:
        if value is not None and not value.isprintable():
            raise ValueError("must be printable (no control characters)")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = endpoint_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class EndpointUpdate(EndpointFields):
    name: Any = _read_only()  # a name is given once, at registration


# The one shape an endpoint is read in: id and name, every field that is not a credential, then what
# only the database knows. What is read can be sent back.
READABLE = tuple(name for name, info in EndpointFields.model_fields.items()
                 if not info.exclude and name not in WRITE_ONLY)
COLUMNS = ", ".join(["id", "name", *(f"{READS[f]} AS {f}" if f in READS else f for f in READABLE),
                     *READ_ONLY_COLUMNS])


def parse(model: type[EndpointFields], data: dict[str, Any]) -> Any:
    """The model of `data`, or EndpointProblem naming the first field refused (unknown fields first:
    a misspelt name also explains the "required" error of the right one); values are never echoed."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        field = ".".join(str(part) for part in error["loc"]) or "(body)"
        if error["type"] == "extra_forbidden":
            raise EndpointProblem(field, "unknown field") from None
        if error["type"] == "missing":
            raise EndpointProblem(field, "required") from None
        raise EndpointProblem(field, wording.field_message(error)) from None


# --- the destination ------------------------------------------------------------------------------


def destination_rules(config: Config) -> DestinationRules:
    security = config.security
    return DestinationRules.from_settings(security.block_private_networks, security.allow_networks,
                                           security.require_https)


@dataclass(frozen=True)
class DestinationScope:
    """The tenant an endpoint is registered in, or belongs to, and the networks granted to it:
    where it may deliver (worker.rules.destinations.tenant_destinations)."""

    tenant: str
    granted: tuple[str, ...] = ()

    def rules(self, config: Config) -> DestinationRules:
        return tenant_destinations(destination_rules(config), self.tenant, self.granted)


def allow_networks_hint(problem: str, address: Address | None) -> str:
    """How to allow a refused private address, for a message that says it was refused."""
    if not refused_as_private(problem):
        return ""
    return f"list {_network(address)} under security.allow_networks in the config file"


def grant_hint(problem: str, address: Address | None, scope: DestinationScope) -> str:
    """How the operator lets a tenant's endpoints reach a refused private address: grant its
    network to the tenant, with those granted already."""
    if not refused_as_private(problem):
        return ""
    networks = ",".join([*scope.granted, _network(address)])
    return (f"grant its network to tenant {scope.tenant}: webhook-worker tenants update {scope.tenant} "
            f"--allow-networks {networks}")


def _network(address: Address | None) -> str:
    return f"{address}/{address.max_prefixlen}" if address is not None else "its network (a CIDR)"


# A host's addresses now (worker.names.addresses: DNS, blocking), handed to check_destination.
Resolve = Callable[[str, int], list[str]]


def check_destination(url: str, config: Config, scope: DestinationScope, advise: bool,
                      resolve: Resolve) -> str | None:
    """Refuse a URL the workers would refuse for an endpoint of `scope`'s tenant: its form, an IP
    literal, or a name that resolves only to refused addresses now (EndpointProblem on `url`).
    Workers check again at every connection; a name that does not resolve yet is accepted, and the
    warning returned says so. `advise`: the caller is the operator (unscoped), whom the refusal
    tells how to allow the address; a tenant's own caller is told only that it is not allowed.
    `resolve` gives a host's addresses: blocking (DNS), so the API and the console call this in a
    thread, never inside a transaction."""
    rules = scope.rules(config)

    def hint(problem: str, address: Address | None) -> str:
        if not advise:
            return ""
        if rules.tenant_scoped:
            return grant_hint(problem, address, scope)
        return allow_networks_hint(problem, address)

    problem = registration_url_problem(url, rules)
    if problem is not None:
        literal = ip_literal(urlsplit(url).hostname or "") if refused_as_private(problem) else None
        raise EndpointProblem("url", problem, hint=hint(problem, literal))
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ip_literal(host) is not None:
        return None
    try:
        found = resolve(host, parts.port or 443)
    except UnicodeError:  # the host cannot be written as a DNS name (IDNA): it can never resolve
        raise EndpointProblem("url", "the host is not a valid domain name") from None
    except OSError:
        return f"{host} does not resolve now; deliveries fail as `dns` until it does"
    reasons = [address_blocked(address, rules) for address in found]
    if reasons and all(reasons):
        raise EndpointProblem("url", f"{host} resolves to a refused address: {reasons[0]}",
                              hint=hint(reasons[0] or "", ip_literal(found[0])))
    return None


# --- register and update ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Registered:
    id: int
    name: str
    url_display: str
    signing_secret: str


def check_routing_key(body_format: str | None, routing_key: str | None, stored_format: str | None = None,
                       stored_key: bool = False) -> None:
    """A routing key only with the PagerDuty format (it would be ignored otherwise), and that format
    only with one. `stored_*` describe the endpoint an update changes."""
    effective = body_format or stored_format
    if routing_key is not None and not routing_key.strip():
        raise EndpointProblem("routing_key", "must not be empty")
    if routing_key is not None and effective != "pagerduty":
        raise EndpointProblem("routing_key",
                              f"only with body_format pagerduty (the format is {effective or 'raw'})")
    if body_format == "pagerduty" and routing_key is None and not stored_key:
        raise EndpointProblem("routing_key", "required with body_format pagerduty")


# coalescing's rules name the CLI's options; the models name fields
_COALESCING_OPTIONS = {"--coalesce-max": "coalesce_max", "--coalesce-window": "coalesce_window",
                       "--format": "body_format"}


def coalescing_changes(body: EndpointFields, body_format: str | None, stored_max: int | None = None
                ) -> dict[str, Any]:
    try:
        return coalescing.settings_changes(body.coalesce_max, body.coalesce_window, body_format, stored_max)
    except ValueError as exc:
        option, _, detail = str(exc).partition(": ")
        field = _COALESCING_OPTIONS.get(option.partition(" ")[0], "(body)")
        for cli, name in _COALESCING_OPTIONS.items():
            detail = detail.replace(cli, name)
        raise EndpointProblem(field, detail) from None


def columns_of(body: EndpointFields) -> dict[str, Any]:
    """webhooks.update_endpoint's fields for what the body gives (OWN_RULES apart, but the URL)."""
    found: dict[str, Any] = {}
    if body.url is not None:
        found["url"] = body.url
        found["url_display"] = display_url(body.url)
    for name, info in EndpointFields.model_fields.items():
        value = getattr(body, name)
        if value is None or info.exclude or name in OWN_RULES:
            continue
        if value == "":
            value = None  # an empty text clears an optional text (a description)
        column, write = WRITES.get(name, (name, lambda given: given))
        found[column] = write(value)
    return found


def refused_tenant(tenant: str | None) -> EndpointProblem:
    return EndpointProblem("tenant", f"no tenant named {tenant!r} (tenants list shows them)")
