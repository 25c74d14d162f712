"""The worker's configuration: YAML plus environment overrides, validated once into frozen objects."""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from worker.errors import ConfigError
from worker.rules import wording
from worker.rules.forwarded import network_problem
from worker.rules.portal import base_url_problem, origin

ENV_PREFIX = "WEBHOOK_WORKER_"
# What PyYAML raises, besides YAMLError, for a malformed tagged scalar such as `!!int x`.
YAML_VALUE_ERRORS = (ValueError, TypeError, KeyError, AttributeError)
# Seconds a lease must outlast the request timeout, so a slow request is not reclaimed mid-flight.
LEASE_MARGIN_SECONDS = 5.0
# The bounds webhooks.acquire() accepts (sql/functions/claim.sql): a longer lease would keep a
# crashed worker's rows for longer than an hour.
MAX_LEASE_SECONDS = 3600
MAX_CLAIM_BATCH_SIZE = 10_000
# The bound webhooks.purge() accepts (sql/functions/retention.sql).
MAX_PURGE_BATCH_SIZE = 100_000
DEFAULT_SHUTDOWN_GRACE_SECONDS = 60.0
DEFAULT_PURGE_BUDGET_SECONDS = 5.0


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DatabaseConfig(_Section):
    url: str = Field(min_length=1)
    pool_min_size: int = Field(default=1, ge=1)
    pool_max_size: int = Field(default=4, ge=1, le=100)
    connect_timeout_seconds: float = Field(default=10.0, gt=0, le=300)

    @model_validator(mode="after")
    def _pool_bounds(self) -> DatabaseConfig:
        if self.pool_min_size > self.pool_max_size:
            raise ValueError("pool_min_size must not exceed pool_max_size")
        return self


class WorkerConfig(_Section):
    id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}", min_length=1)
    # Twice the default claim batch: a claim starts once half a batch of slots is free, and with
    # twice the batch in flight a batch or more is still being sent while it runs (README, Tuning).
    concurrency: int = Field(default=200, ge=1, le=10_000)
    poll_interval_seconds: float = Field(default=1.0, gt=0, le=3600)
    finish_max_delay_seconds: float = Field(default=0.05, ge=0, le=10)
    # Longer than any request under the default 60 s lease (at most 55 s, see check_lease): with
    # the defaults a SIGTERM never cuts a request short. A request still open when the grace ends
    # is recorded as an interrupted attempt and sent again.
    shutdown_grace_seconds: float = Field(default=DEFAULT_SHUTDOWN_GRACE_SECONDS, ge=0, le=3600)
    # auto: asyncio's own loop (uvloop was measured and not adopted: docs/performance.md); uvloop
    # needs the optional extra.
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    # A pool of its own for some tenants: only these (tenants), or all but these (exclude_tenants).
    tenants: list[str] | None = Field(default=None, min_length=1)
    exclude_tenants: list[str] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_pool_rule(self) -> WorkerConfig:
        if self.tenants is not None and self.exclude_tenants is not None:
            raise ValueError("worker.tenants and worker.exclude_tenants: give one, not both")
        return self


class DeliveryConfig(_Section):
    """Per-process overrides of webhooks.delivery_config; unset means the database's value."""

    timeout_seconds: float | None = Field(default=None, gt=0, le=300)
    lease_seconds: int | None = Field(default=None, ge=1, le=MAX_LEASE_SECONDS)
    claim_batch_size: int | None = Field(default=None, ge=1, le=MAX_CLAIM_BATCH_SIZE)
    finish_batch_size: int | None = Field(default=None, ge=1, le=10_000)

    @model_validator(mode="after")
    def _lease_outlasts_timeout(self) -> DeliveryConfig:
        if self.timeout_seconds is not None and self.lease_seconds is not None:
            check_lease(self.lease_seconds, self.timeout_seconds)
        return self


class HttpConfig(_Section):
    """The probes and /metrics."""

    enabled: bool = True
    host: str = "0.0.0.0"  # probes must be reachable from the kubelet
    port: int = Field(default=8080, ge=0, le=65535)  # 0: any free port (logged at start-up)
    # Per-endpoint metric labels (circuit state) for at most this many endpoints, so the number of
    # series stays bounded however many endpoints are registered.
    endpoint_label_limit: int = Field(default=100, ge=0, le=10_000)
    stats_interval_seconds: float = Field(default=15.0, gt=0, le=3600)


class HousekeepingConfig(_Section):
    """The worker's side duties: disabled endpoints' expired rows, log partitions, retention."""

    interval_seconds: float = Field(default=30.0, gt=0, le=3600)
    # Rows per webhooks.purge() call, each call one short transaction.
    purge_batch_size: int = Field(default=1000, ge=1, le=MAX_PURGE_BATCH_SIZE)
    # How long one round may go on purging while it finds full batches; a round that runs out of it
    # with rows left is followed by the next after this long rather than a whole interval. Not
    # given: DEFAULT_PURGE_BUDGET_SECONDS, or the interval when that is shorter.
    purge_budget_seconds: float = Field(default=DEFAULT_PURGE_BUDGET_SECONDS, gt=0, le=3600)

    @model_validator(mode="before")
    @classmethod
    def _budget_from_interval(cls, data: Any) -> Any:
        """A lone interval shorter than the default budget is valid: the budget follows it."""
        if isinstance(data, Mapping) and "purge_budget_seconds" not in data:
            interval = data.get("interval_seconds")
            if isinstance(interval, int | float) and not isinstance(interval, bool) and \
                    0 < interval < DEFAULT_PURGE_BUDGET_SECONDS:
                return {**data, "purge_budget_seconds": float(interval)}
        return data

    @model_validator(mode="after")
    def _budget_within_interval(self) -> HousekeepingConfig:
        if self.purge_budget_seconds > self.interval_seconds:
            raise ValueError(
                f"purge_budget_seconds ({self.purge_budget_seconds:g}) must not exceed interval_seconds "
                f"({self.interval_seconds:g})")
        return self


class SecurityConfig(_Section):
    """Credentials at rest, where deliveries may go, and how much a receiver may send back."""

    # A mounted file (a Kubernetes Secret) of keys, one per line, the first sealing new values.
    # WEBHOOK_WORKER_ENCRYPTION_KEYS, when set, takes precedence.
    encryption_keys_file: str | None = None
    # Refuse credentials stored in plaintext (rows written before sealing existed, or by hand in
    # SQL): their deliveries fail with a clear error until `webhook-worker keys rotate` seals them.
    require_sealed: bool = True
    # Destinations resolving to loopback, private, link-local, CGNAT, multicast or reserved addresses
    # are refused unless listed here (CIDRs, e.g. "10.20.0.0/16" for an internal receiver).
    allow_networks: list[str] = Field(default_factory=list)
    block_private_networks: bool = True
    require_https: bool = False
    # PEM certificates of a private CA that signs internal receivers' certificates, trusted in
    # addition to the system's CAs.
    ca_bundle_file: str | None = None
    max_response_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    max_response_header_bytes: int = Field(default=8 * 1024, ge=1024, le=64 * 1024)

    @model_validator(mode="after")
    def _networks_parse(self) -> SecurityConfig:
        for entry in self.allow_networks:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"allow_networks: {wording.json_text(entry)} is not a CIDR such as "
                                 "10.0.0.0/8") from None
        return self

    @field_validator("ca_bundle_file")
    @classmethod
    def _ca_bundle_loads(cls, path: str | None) -> str | None:
        if path is not None:
            try:
                tls_context(path)
            except ssl.SSLError:
                raise ValueError("cannot be loaded: not PEM certificates") from None
            except OSError as exc:
                reason = exc.strerror or type(exc).__name__
                raise ValueError(f"cannot be loaded: {reason}") from None
        return path


def tls_context(ca_bundle_file: str | None) -> ssl.SSLContext:
    """Certificate verification as browsers do it, trusting the system's CAs and, if given, a
    private CA bundle too."""
    context = ssl.create_default_context()
    if ca_bundle_file is not None:
        context.load_verify_locations(cafile=ca_bundle_file)
    return context


class ApiConfig(_Section):
    """The HTTP API process (`webhook-worker api`)."""

    host: str = "0.0.0.0"  # reachable from the cluster's Service and probes
    port: int = Field(default=8000, ge=0, le=65535)  # 0: any free port (logged at start-up)
    # Failed authentications one client address may make per minute; beyond it, 429 until the
    # minute has passed, so tokens cannot be guessed at speed.
    failed_auth_per_minute: int = Field(default=20, ge=1, le=100_000)
    # Proxies (addresses or CIDRs) whose X-Forwarded-For / Forwarded headers name the client whose
    # failures are counted; from any other peer those headers are ignored (anyone can send them).
    trusted_proxies: list[str] = Field(default_factory=list)
    # Request bodies above this are refused (413) before they are read; the payload limit itself
    # (webhooks.delivery_config.max_payload_bytes) is checked by the database.
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=128 * 1024 * 1024)
    # Rows a bulk replay puts back per step; with a rate, steps are spaced to keep to it.
    replay_step_rows: int = Field(default=100, ge=1, le=10_000)
    # /metrics has a listener of its own on api.host: request counts per route and status would let
    # any caller of the public port watch everyone's traffic. 0: any free port (logged at start-up).
    metrics_port: int = Field(default=8001, ge=0, le=65535)
    # Slow clients: a request head must arrive whole within head_timeout_seconds of its first byte
    # (or of the connection opening), a body within body_timeout_seconds of its head (else 408);
    # an idle keep-alive connection is closed after keepalive_timeout_seconds (keep it above the
    # idle timeout of a proxy in front, or the proxy may send on a connection being closed).
    head_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    body_timeout_seconds: float = Field(default=20.0, gt=0, le=3600)
    keepalive_timeout_seconds: float = Field(default=75.0, gt=0, le=7200)
    # Connections beyond these are answered 503 and closed at once, so one address (or many) cannot
    # take every file the process may open; an idle keep-alive connection is closed first to make
    # room. Behind a proxy every client shares the proxy's address. IPv6 clients count per /64.
    max_connections: int = Field(default=1000, ge=1, le=1_000_000)
    max_connections_per_address: int = Field(default=100, ge=1, le=1_000_000)
    # The metrics port's own budget, apart from the caps above, so that a full public port never
    # keeps the scrape out; a quarter of it (at least 1) per client address.
    metrics_max_connections: int = Field(default=16, ge=1, le=1000)
    # A publish of an event type the catalogue (webhooks.event_types) does not hold is refused (422)
    # rather than accepted; off, only catalogued types with a schema are checked
    # (worker/rules/event_types.py).
    require_known_event_types: bool = False
    # Where people reach the API (https://webhooks.example.com): the origin of portal links. Unset,
    # the API takes it from a trusted proxy's forwarded headers (trusted_proxies), else from the
    # address the request arrived at, never from a Host header anyone can send; the CLI from
    # host and port.
    public_url: str | None = None
    # A publish's payloads are checked against their types' JSON Schemas in processes of their own
    # (worker/web/schema_checks.py): this many, and a request's checks may take this long together;
    # past it the process is killed, and the payloads not checked by then are refused (422).
    schema_validation_processes: int = Field(default=1, ge=1, le=64)
    schema_validation_budget_seconds: float = Field(default=1.0, gt=0, le=60)

    @model_validator(mode="after")
    def _ports_and_caps(self) -> ApiConfig:
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"metrics_port must differ from port (both {self.port})")
        if self.max_connections_per_address > self.max_connections:
            raise ValueError(f"max_connections_per_address ({self.max_connections_per_address}) must not "
                             f"exceed max_connections ({self.max_connections})")
        return self

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = base_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return origin(value)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_parse(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            problem = network_problem(entry)
            if problem is not None:
                raise ValueError(problem)
        return entries


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class Config(_Section):
    database: DatabaseConfig
    worker: WorkerConfig = WorkerConfig()
    delivery: DeliveryConfig = DeliveryConfig()
    http: HttpConfig = HttpConfig()
    housekeeping: HousekeepingConfig = HousekeepingConfig()
    security: SecurityConfig = SecurityConfig()
    api: ApiConfig = ApiConfig()
    logging: LoggingConfig = LoggingConfig()


def check_lease(lease_seconds: float, timeout_seconds: float) -> None:
    """Raise ValueError unless the lease outlasts the timeout by the margin."""
    if lease_seconds < timeout_seconds + LEASE_MARGIN_SECONDS:
        raise ValueError(
            f"lease_seconds ({lease_seconds:g}) must be at least timeout_seconds "
            f"({timeout_seconds:g}) + {LEASE_MARGIN_SECONDS:g}"
        )


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read the YAML file (if any), apply environment overrides and validate."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not UTF-8 text") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise ConfigError(f"{path}: not valid YAML{where}") from None
        except YAML_VALUE_ERRORS:
            raise ConfigError(f"{path}: a tagged value (such as !!int) cannot be read") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        raw = loaded
    for name, section in raw.items():
        if section is not None and not isinstance(section, dict) and name in Config.model_fields:
            raise ConfigError(f"{name}: must be a mapping, got {type(section).__name__}")
    _apply_environment(raw, environ)
    if "url" not in (raw.get("database") or {}):
        raise ConfigError("database.url: missing (set it in the file or in DATABASE_URL)")
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_first_error(exc)) from None


def _apply_environment(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    """DATABASE_URL, and WEBHOOK_WORKER_<SECTION>__<KEY> for every key (values parsed as YAML)."""
    url = environ.get(f"{ENV_PREFIX}DATABASE__URL") or environ.get("DATABASE_URL")
    if url:
        _section(raw, "database")["url"] = url
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name == f"{ENV_PREFIX}DATABASE__URL":
            continue
        section, sep, key = name[len(ENV_PREFIX) :].lower().partition("__")
        if not sep or not key:
            continue
        try:
            parsed = yaml.safe_load(value) if value else value
        except (yaml.YAMLError, *YAML_VALUE_ERRORS):
            # never echo the value: it may be a credential
            raise ConfigError(f"{name}: not a valid YAML value") from None
        _section(raw, section)[key] = parsed


def _section(raw: dict[str, Any], name: str) -> dict[str, Any]:
    section = raw.get(name)
    if section is None:
        section = raw[name] = {}
    if not isinstance(section, dict):
        raise ConfigError(f"{name}: must be a mapping, got {type(section).__name__}")
    return section


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"]) or "(top level)"
    # one line, whatever characters a key holds
    key = "".join(c if c.isprintable() else repr(c)[1:-1] for c in key)
    if error["type"] == "extra_forbidden":
        return f"{key}: unknown key"
    if error["type"] == "missing":
        return f"{key}: missing"
    message = wording.field_message(error)
    value = error.get("input")
    # Never echo a URL: it may carry a password or, for a receiver, its secret.
    if value is None or isinstance(value, dict | list) or "url" in key:
        return f"{key}: {message}"
    return f"{key}: {message} (got {wording.json_text(value, limit=500)})"
