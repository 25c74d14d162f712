"""The `webhook-worker` command: run the worker, migrate the schema, manage endpoints, run the demo."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from worker import __version__, coalescing, operations, schema, signing
from worker.config import Config, load_config
from worker.delivery import display_url
from worker.destinations import Address, address_blocked, ip_literal
from worker.encryption import Keyring, KeyringError, generate_key, load_keyring
from worker.errors import ConfigError
from worker.model import Sent
from worker.observability import configure_logging, get_logger
from worker.operations import (
    EndpointSpec,
    find_endpoint,
    list_endpoints,
    register_endpoint,
    set_circuit,
    set_endpoint_active,
)
from worker.policy import CATEGORIES, RetrySchedule
from worker.registration import (
    endpoint_name_problem,
    header_problem,
    headers_problem,
    registration_url_problem,
)
from worker.tables import cell, print_table

# One rule for every command (README, "Exit status"): 0 done; 1 understood but not done (the
# database unreachable or refusing, what the command names does not exist, or its state refuses the
# change); 2 what the user gave is wrong: the command line or the configuration, keys included.
EXIT_USAGE = 2
EXIT_FAILURE = 1


class UsageError(Exception):
    """A command-line value that cannot be used; the message names the option."""


class CommandFailed(Exception):
    """A well-formed command that could not be done: what it names does not exist, or the state of
    the database refuses it."""


def _config(args: argparse.Namespace) -> Config:
    return load_config(getattr(args, "config", None))


def cmd_run(args: argparse.Namespace) -> int:
    # Until the event loop installs its own handlers, SIGTERM means "nothing claimed yet: exit 0".
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    from worker import runtime
    from worker.daemon import serve

    config = _config(args)
    configure_logging(config.logging.level, config.logging.format)
    try:
        loop = runtime.chosen_loop(config.worker.event_loop, runtime.uvloop_installed())
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    log = get_logger()
    # Thousands of concurrent sockets (slow receivers, high worker.concurrency) need more than the
    # usual soft limit of 1,024 open files.
    raised = runtime.raise_open_files_limit()
    if raised is not None:
        log.info("open-files soft limit raised", before=raised[0], after=raised[1])
    with asyncio.Runner(loop_factory=runtime.loop_factory(loop)) as runner:
        running = type(runner.get_loop()).__module__.split(".")[0]  # the loop's package: what runs
        log.info("event loop chosen", loop=running, setting=config.worker.event_loop)
        runner.run(serve(config))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    config = _config(args)
    applied = schema.migrate(config.database.url, on_notice=lambda message: print(f"note: {message}"))
    for name in applied:
        print(f"applied {name}")
    print(f"schema at version {schema.latest_version()} ({len(applied)} applied)")
    for advice in schema.role_advice(config.database.url):
        print(advice, file=sys.stderr)
    return 0


def _parse_headers(values: Sequence[str], option: str = "--header") -> dict[str, str]:
    """'Name: value' items as a mapping, each checked by the registration rules; a message names the
    option and the header (or its position, when the name is unusable), never the value."""
    headers: dict[str, str] = {}
    for position, value in enumerate(values, start=1):
        name, sep, content = value.partition(":")
        name, content = name.strip(), content.strip(" \t")
        if not sep or not name:
            raise UsageError(f"{option} {position}: expected 'Name: value'")  # never echo: a credential
        problem = header_problem(name, content)
        if problem is not None:
            raise UsageError(f"{option} {position}: {problem}")
        if name.lower() in (n.lower() for n in headers):
            raise UsageError(f"{option} {name}: given twice (header names are case-insensitive)")
        headers[name] = content
    return headers


def _headers(args: argparse.Namespace, inputs: SecretInputs) -> dict[str, str] | None:
    """The headers of --header and --header-file together; None when neither was given."""
    if not args.header and args.header_file is None:
        return None
    headers = _parse_headers(args.header or [])
    if args.header_file is not None:
        lines = [line for line in inputs.read("--header-file", args.header_file).splitlines() if line.strip()]
        from_file = _parse_headers(lines, "--header-file line")
        for name in from_file:
            if name.lower() in (n.lower() for n in headers):
                raise UsageError(f"--header-file {name}: also given with --header")
        headers.update(from_file)
    return headers


class SecretInputs:
    """Values read from files or standard input (`-`), so credentials stay out of the process list
    and the shell history. Standard input can be read once, by one option."""

    def __init__(self) -> None:
        self._stdin_option: str | None = None

    def read(self, option: str, path: str) -> str:
        if path == "-":
            if self._stdin_option is not None:
                raise UsageError(f"{option} -: standard input is already read by {self._stdin_option} -")
            self._stdin_option = option
            return sys.stdin.read()
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{option}: cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"{option}: {path} is not UTF-8 text") from None

    def value(self, args: argparse.Namespace, name: str) -> str | None:
        """--NAME, or the first line of --NAME-file's content with surrounding whitespace removed."""
        option = "--" + name.replace("_", "-")
        path = getattr(args, f"{name}_file", None)
        if path is None:
            return getattr(args, name)  # type: ignore[no-any-return]
        text = self.read(f"{option}-file", path).strip()
        if not text:
            raise UsageError(f"{option}-file: empty")
        if "\n" in text:
            raise UsageError(f"{option}-file: expected one line")
        return text


def verify_endpoint(url: str, secret: str, timeout: float, config: Config) -> str | None:
    """POST a signed challenge; None if the receiver echoed it in a 2xx answer, else the problem.
    Sent by the workers' own HTTP stack, so the same destination rules apply."""
    from worker.daemon import sender_for

    challenge = secrets.token_urlsafe(24)
    body = json.dumps({"type": "webhook.endpoint.verification", "challenge": challenge}).encode()
    msg_id = "msg_verify_" + secrets.token_hex(8)
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json", "User-Agent": f"webhook-worker/{__version__}",
        "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
        "webhook-signature": signing.sign(secret, msg_id, timestamp, body),
        "webhook-event-type": "webhook.endpoint.verification",
    }

    async def post() -> Sent:
        sender = sender_for(config)
        await sender.start()
        try:
            return await sender.post(url, body, headers, timeout, timeout)
        finally:
            await sender.close()

    sent = asyncio.run(post())
    if sent.result.status is None:
        return f"no answer ({sent.result.error or sent.result.failure})"
    if not 200 <= sent.result.status < 300:
        return f"HTTP {sent.result.status}"
    return None if challenge in (sent.excerpt or "") else "the answer did not contain the challenge"


def _check_secret(secret: str) -> None:
    problem = signing.secret_problem(secret)
    if problem is not None:
        raise UsageError(f"--secret: {problem}")


def _schedule(delays: str) -> dict[str, Any]:
    try:
        schedule = {"delays": [float(d) for d in delays.split(",")]}
        RetrySchedule.from_json(schedule, 0.0)
    except ValueError:
        raise UsageError("--retry-delays: expected 1 to 100 delays of 0 to 604800 seconds, "
                         "separated by commas") from None
    return schedule


def _keyring(config: Config) -> Keyring:
    return load_keyring(config.security.encryption_keys_file, os.environ)


def _check_url(url: str, config: Config) -> None:
    """Refuse a URL the workers would refuse: its form, an IP literal, or a name that resolves only
    to refused addresses now. Workers check again at every connection (the name may change)."""
    from worker.daemon import destination_policy

    policy = destination_policy(config)
    problem = registration_url_problem(url, policy)
    if problem is not None:
        # only an IP literal's address is refused here, and a URL with one parses
        literal = ip_literal(urlsplit(url).hostname or "") if "not a public address" in problem else None
        raise UsageError(f"--url: {problem}{allow_networks_hint(problem, literal)}")
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ip_literal(host) is not None:
        return
    try:
        infos = socket.getaddrinfo(host, parts.port or 443, type=socket.SOCK_STREAM)
    except OSError:
        print(f"warning: {host} does not resolve now; deliveries fail as `dns` until it does",
              file=sys.stderr)
        return
    reasons = [address_blocked(str(info[4][0]), policy) for info in infos]
    if all(reasons):
        hint = allow_networks_hint(reasons[0] or "", ip_literal(str(infos[0][4][0])))
        raise UsageError(f"--url: {host} resolves to a refused address: {reasons[0]}{hint}")


def allow_networks_hint(problem: str, address: Address | None) -> str:
    """How to allow a refused private address, for a message that says it was refused."""
    if "not a public address" not in problem:
        return ""
    network = f"{address}/{address.max_prefixlen}" if address is not None else "its network (a CIDR)"
    return (f"; to deliver there, list {network} under security.allow_networks in the config file "
            "given with --config")


def _check_endpoint_options(args: argparse.Namespace, require_name: bool = True) -> None:
    """Refuse bad values here, before SQL sees them: a constraint violation would make the server
    log the whole row, URL and secret included."""
    if require_name and (problem := endpoint_name_problem(args.name)) is not None:
        raise UsageError(f"--name: {problem}")
    if args.max_attempts is not None and not 1 <= args.max_attempts <= 100:
        raise UsageError("--max-attempts: expected 1 to 100")
    if args.timeout_seconds is not None and not 0.1 <= args.timeout_seconds <= 300:
        raise UsageError("--timeout-seconds: expected 0.1 to 300")
    if args.rate_limit is not None and not args.rate_limit > 0:
        raise UsageError("--rate-limit: expected a number of requests per second above 0")
    if args.burst is not None and args.burst < 1:
        raise UsageError("--burst: expected at least 1")
    if args.max_in_flight is not None and args.max_in_flight < 1:
        raise UsageError("--max-in-flight: expected at least 1")
    for event_type in args.event_type or []:
        if not event_type.strip():
            raise UsageError("--event-type: must not be empty")


def _check_routing_key(body_format: str | None, routing_key: str | None, stored_format: str | None = None,
                       stored_key: bool = False) -> None:
    """A routing key only with the PagerDuty format (it would be ignored otherwise), and that format
    only with one. `stored_*` describe the endpoint an update changes."""
    effective = body_format or stored_format
    if routing_key is not None and not routing_key.strip():
        raise UsageError("--routing-key: must not be empty")
    if routing_key is not None and effective != "pagerduty":
        raise UsageError(f"--routing-key: only with --format pagerduty (the format is {effective or 'raw'})")
    if body_format == "pagerduty" and routing_key is None and not stored_key:
        raise UsageError("--routing-key: required with --format pagerduty")


def add_coalescing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coalesce-max", type=int, metavar="N",
                        help="alert storms: when more rows are due than the limits let through, send up "
                             "to N as one digest request (slack, mattermost, envelope; 0 turns it off)")
    parser.add_argument("--coalesce-window", type=float, metavar="SECONDS",
                        help="with --coalesce-max: also coalesce once the oldest due row waited this long")


def _check_ttl(ttl_seconds: float | None) -> None:
    if ttl_seconds is not None and not 0 < ttl_seconds <= 365 * 86400:
        raise UsageError("--ttl-seconds: expected a number of seconds above 0, at most a year")


def cmd_endpoints_add(args: argparse.Namespace) -> int:
    config = _config(args)
    keyring = _keyring(config)
    inputs = SecretInputs()
    url = inputs.value(args, "url")
    if url is None:
        raise UsageError("--url or --url-file: required")
    _check_url(url, config)
    _check_endpoint_options(args)
    _check_ttl(args.ttl_seconds)
    secret = inputs.value(args, "secret") or signing.generate_secret()
    _check_secret(secret)
    routing_key = inputs.value(args, "routing_key")
    _check_routing_key(args.format, routing_key)
    headers = _headers(args, inputs) or {}
    problem = headers_problem(url, headers)
    if problem is not None:
        raise UsageError(f"--header {problem}")
    schedule = _schedule(args.retry_delays) if args.retry_delays else None
    try:
        coalesce = coalescing.policy_changes(args.coalesce_max, args.coalesce_window, args.format)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    spec = EndpointSpec(
        name=args.name,
        url=url,
        url_display=display_url(url),
        signing_secrets=(secret,),
        event_types=tuple(args.event_type or ["*"]),
        headers=headers,
        max_attempts=args.max_attempts,
        timeout_ms=int(args.timeout_seconds * 1000) if args.timeout_seconds else None,
        retry_schedule=schedule,
        rate_limit_per_second=args.rate_limit,
        rate_limit_burst=args.burst,
        max_in_flight=args.max_in_flight,
        body_format=args.format,
        secret_settings={"routing_key": routing_key} if routing_key else {},
        active=not args.verify,
        tenant=args.tenant,
        operational_all_tenants=args.operational_all_tenants,
    )
    with operations.connect(config) as conn:
        try:
            endpoint_id = register_endpoint(conn, spec, keyring)
        except psycopg.errors.UniqueViolation:
            raise CommandFailed(f"--name {args.name!r}: an endpoint with this name exists") from None
        except psycopg.errors.NoDataFound:
            raise UsageError(f"--tenant: no tenant named {args.tenant!r} (tenants list shows them)") from None
        except psycopg.errors.CheckViolation as exc:
            if exc.diag.constraint_name == "tenant_max_endpoints":
                raise CommandFailed(f"--tenant: {exc.diag.message_primary}") from None
            raise UsageError(f"invalid endpoint: {exc.diag.constraint_name}") from None
        except operations.InvalidEndpoint as exc:
            raise UsageError(str(exc)) from None
        if args.ttl_seconds:
            ttl = {"delivery_ttl": f"{args.ttl_seconds} seconds"}
            operations.update_endpoint(conn, endpoint_id, ttl, keyring)
        if coalesce:
            operations.update_endpoint(conn, endpoint_id, coalesce, keyring)
        if args.verify:
            problem = verify_endpoint(url, secret, timeout=10.0, config=config)
            if problem:
                print(f"endpoint {endpoint_id} registered but left disabled: verification failed: {problem}",
                      file=sys.stderr)
                return EXIT_FAILURE
            set_endpoint_active(conn, endpoint_id, True, "")
    if args.json:
        print(json.dumps({"id": endpoint_id, "name": spec.name, "signing_secret": secret}))
    else:
        print(f"endpoint {endpoint_id} created: {spec.name} → {spec.url_display}")
        print(f"signing secret (shown once, give it to the receiver): {secret}")
    return 0


def _endpoint_id(conn: psycopg.Connection, name_or_id: str) -> int:
    endpoint_id = find_endpoint(conn, name_or_id)
    if endpoint_id is None:
        raise CommandFailed(f"ENDPOINT {name_or_id!r}: no endpoint with this name or id")
    return endpoint_id


def cmd_endpoints_enable(args: argparse.Namespace) -> int:
    return _set_active(args, active=True)


def cmd_endpoints_disable(args: argparse.Namespace) -> int:
    return _set_active(args, active=False)


def _set_active(args: argparse.Namespace, active: bool) -> int:
    config = _config(args)
    with operations.connect(config) as conn:
        endpoint_id = _endpoint_id(conn, args.endpoint)
        change = set_endpoint_active(conn, endpoint_id, active, getattr(args, "reason", ""))
    state = "enabled" if active else "disabled"
    print(f"endpoint {endpoint_id} {state}" if change else f"endpoint {endpoint_id} was already {state}")
    return 0


def cmd_endpoints_circuit(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.action != "open" and args.until:
        raise UsageError("--until: only with 'open'")
    with operations.connect(config) as conn:
        endpoint_id = _endpoint_id(conn, args.endpoint)
        change = set_circuit(conn, endpoint_id, args.action, args.until)
    print(f"endpoint {endpoint_id}: {change}")
    return 0


def cmd_endpoints_list(args: argparse.Namespace) -> int:
    config = _config(args)
    try:
        keyring: Keyring | None = _keyring(config)
    except KeyringError as exc:
        keyring = None  # the list is still useful without the keys; only the fingerprints need them
        print(f"webhook-worker: URL fingerprints not shown: {exc}", file=sys.stderr)
    with operations.connect(config) as conn:
        rows = list_endpoints(conn)
        fingerprints = operations.url_fingerprints(conn, keyring) if keyring is not None else {}
    for row in rows:
        row["url_fingerprint"] = fingerprints.get(row["id"])
    if args.json:
        print(json.dumps(rows, default=str))
        return 0
    columns = ["id", "name", "url_display", "url_fingerprint", "active", "event_types", "health_status",
               "circuit_state", "successes", "failures"]
    print_table(columns, [[cell(row[c]) for c in columns] for row in rows])
    return 0


def _connect(args: argparse.Namespace) -> psycopg.Connection:
    return operations.connect(_config(args))


def _emit(args: argparse.Namespace, data: Any, columns: Sequence[str] | None = None) -> None:
    """JSON for scripts (--json), a table for people."""
    if getattr(args, "json", False):
        print(json.dumps(data, default=str, indent=None))
    elif columns is not None:
        rows = data if isinstance(data, list) else [data]
        print_table(columns, [[cell(row.get(c)) for c in columns] for row in rows])
    else:
        for key, value in data.items():
            print(f"{key}: {cell(value)}")


def cmd_endpoints_show(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        details = operations.show_endpoint(conn, _endpoint_id(conn, args.endpoint))
    if args.json:
        _emit(args, details)
        return 0
    events, queued = details.pop("events"), details.pop("queued")
    _emit(args, details)
    print(f"queued: {', '.join(f'{k} {v}' for k, v in queued.items()) or 'nothing'}")
    if events:
        print("\nrecent state changes:")
        print_table(["at", "change", "reason", "decided_by"],
                    [[cell(e[c]) for c in ("at", "change", "reason", "decided_by")] for e in events])
    return 0


def cmd_endpoints_update(args: argparse.Namespace) -> int:
    config = _config(args)
    keyring = _keyring(config)
    inputs = SecretInputs()
    changes: dict[str, Any] = {}
    url = inputs.value(args, "url")
    if url is not None:
        _check_url(url, config)
        changes["url"] = url
        changes["url_display"] = display_url(url)
    _check_endpoint_options(args, require_name=False)
    _check_ttl(args.ttl_seconds)
    if args.event_type:
        changes["event_types"] = args.event_type
    headers = _headers(args, inputs)
    if headers is not None:
        changes["headers"] = headers
    for option, column in (("max_attempts", "max_attempts"), ("rate_limit", "rate_limit_per_second"),
                           ("burst", "rate_limit_burst"), ("max_in_flight", "max_in_flight")):
        if getattr(args, option) is not None:
            changes[column] = getattr(args, option)
    if args.timeout_seconds is not None:
        changes["timeout_ms"] = int(args.timeout_seconds * 1000)
    if args.retry_delays:
        changes["retry_schedule"] = _schedule(args.retry_delays)
    if args.ttl_seconds is not None:
        changes["delivery_ttl"] = f"{args.ttl_seconds} seconds"
    if args.format is not None:
        changes["body_format"] = args.format
    if args.operational_all_tenants is not None:
        changes["operational_all_tenants"] = args.operational_all_tenants
    routing_key = inputs.value(args, "routing_key")
    coalesce_options = args.coalesce_max is not None or args.coalesce_window is not None
    if not changes and routing_key is None and not coalesce_options:
        raise UsageError("nothing to change: give at least one option")
    with _connect(args) as conn:
        endpoint_id = _endpoint_id(conn, args.endpoint)
        if coalesce_options or args.format is not None:
            stored_format, stored_max = operations.endpoint_coalescing(conn, endpoint_id) or (None, None)
            try:
                changes.update(coalescing.policy_changes(
                    args.coalesce_max, args.coalesce_window, args.format or stored_format, stored_max))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        if routing_key is not None or args.format == "pagerduty":
            stored_format, stored_settings = operations.endpoint_format_and_settings(
                conn, endpoint_id, keyring)
            _check_routing_key(args.format, routing_key, stored_format, "routing_key" in stored_settings)
            if routing_key is not None:
                changes["secret_settings"] = {**stored_settings, "routing_key": routing_key}
        try:
            operations.update_endpoint(conn, endpoint_id, changes, keyring)
        except operations.InvalidEndpoint as exc:
            raise UsageError(str(exc)) from None
    changed = sorted({"routing_key" if k == "secret_settings" else k for k in changes if k != "url_display"})
    print(f"endpoint {endpoint_id} updated: {', '.join(changed)}")
    return 0


def cmd_endpoints_rotate_secret(args: argparse.Namespace) -> int:
    keyring = _keyring(_config(args))
    secret = SecretInputs().value(args, "secret") or signing.generate_secret()
    _check_secret(secret)
    expire_at = None
    if args.expire_old_after is not None:
        expire_at = datetime.now(UTC) + timedelta(hours=args.expire_old_after)
    with _connect(args) as conn:
        endpoint_id = _endpoint_id(conn, args.endpoint)
        active = operations.rotate_secret(conn, endpoint_id, secret, expire_at, keyring)
    if args.json:
        print(json.dumps({"id": endpoint_id, "signing_secret": secret, "secrets": active,
                          "old_expire_at": expire_at}, default=str))
        return 0
    print(f"endpoint {endpoint_id}: new signing secret (shown once): {secret}")
    until = f"until {expire_at:%Y-%m-%d %H:%M:%S} UTC" if expire_at else "until the next rotation"
    print(f"requests now carry {active} signatures; the older secrets stay active {until}")
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    try:
        json.loads(args.payload)
    except ValueError:
        raise UsageError("--payload: not valid JSON") from None
    with _connect(args) as conn:
        delivery_id = operations.enqueue_one(conn, _endpoint_id(conn, args.endpoint), args.event_type,
                                     args.payload, args.key)
    _emit(args, {"delivery_id": delivery_id}) if args.json else print(f"delivery {delivery_id} queued")
    return 0


def _scope(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    """--tenant: this command sees only that tenant's rows."""
    if getattr(args, "tenant", None) is None:
        return
    try:
        operations.scope_to_tenant(conn, args.tenant)
    except psycopg.errors.NoDataFound:
        raise UsageError(f"--tenant: no tenant named {args.tenant!r} (tenants list shows them)") from None


def cmd_status(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        _scope(conn, args)
        status = operations.queue_status(conn)
    if args.json:
        _emit(args, status)
        return 0
    _emit(args, status["queue"], ["status", "deliveries", "oldest_due_age_seconds"])
    if status["held_back"]:
        print()
        _emit(args, status["held_back"], ["reason", "rows"])
    print()
    _emit(args, status["endpoints"], ["id", "name", "active", "health_status", "circuit_state",
                                      "consecutive_failures", "last_success_at", "last_failure_at"])
    return 0


def cmd_deliveries_show(args: argparse.Namespace) -> int:
    if (args.id is None) == (args.key is None):
        raise UsageError("give a delivery id or --key, not both")
    with _connect(args) as conn:
        found = operations.find_deliveries(conn, args.id, args.key)
    if not found:
        raise CommandFailed("no such delivery")
    if args.json:
        _emit(args, found)
        return 0
    for delivery in found:
        history = delivery.pop("history")
        delivery.pop("payload", None)
        _emit(args, delivery)
        print()
        print_table(["attempt", "outcome", "failure_category", "http_status", "latency_ms", "worker_id",
                     "stale", "logged_at", "digest", "error"],
                    [[cell(h[c]) for c in ("attempt", "outcome", "failure_category", "http_status",
                                            "latency_ms", "worker_id", "stale", "logged_at")]
                     + [_digest_cell(h), cell(h["error"])]
                     for h in history])
        print()
    return 0


def _digest_cell(attempt: dict[str, Any]) -> str:
    """"d-17 (37 rows)": the digest that carried the attempt, and how many rows it carried."""
    if attempt.get("digest_id") is None:
        return ""
    return f"{coalescing.digest_label(attempt['digest_id'])} ({attempt['digest_rows']} rows)"


def _filters(conn: psycopg.Connection, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "webhook_id": _endpoint_id(conn, args.endpoint) if args.endpoint else None,
        "event_type": args.event_type,
        "category": args.category,
        "since": _point_in_time(conn, "--since", args.since),
        "until": _point_in_time(conn, "--until", args.until),
    }


def _point_in_time(conn: psycopg.Connection, option: str, value: str | None) -> datetime | None:
    """The option's timestamp or time ago (operations.point_in_time); anything else names the option."""
    if value is None:
        return None
    when = operations.point_in_time(conn, value)
    if when is None:
        raise UsageError(f"{option}: {value!r} is neither a timestamp nor a time ago such as '1 hour ago'")
    return when


def cmd_dlq_list(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        _scope(conn, args)
        rows = operations.dead_letters(conn, _filters(conn, args), args.limit)
    _emit(args, rows, ["delivery_id", "endpoint_name", "event_type", "attempts", "failure_category",
                       "last_http_status", "dead_letter_reason", "dead_lettered_at"])
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    filtered = any(getattr(args, f)
                   for f in ("endpoint", "event_type", "category", "since", "until", "tenant"))
    if args.id is not None and (filtered or args.all):
        raise UsageError("give a delivery id, or filters with --all, not both")
    with _connect(args) as conn:
        _scope(conn, args)
        if args.id is not None:
            if not operations.replay_one(conn, args.id):
                raise CommandFailed(f"delivery {args.id} is not a dead letter or delivered row")
            print(f"delivery {args.id} queued again (same webhook-id)")
            return 0
        if not args.all:
            raise UsageError("give a delivery id, or --all with filters to replay every matching dead letter")
        # Batches of the oldest matching dead letters: replayed rows leave the dead-letter state, so
        # an interrupted run simply continues where it stopped when run again. Only those that were
        # dead letters when it started: one that fails again is not replayed a second time, so the
        # run ends even while the receiver keeps refusing.
        filters, total = _filters(conn, args), 0
        filters["until"] = operations.started_before(conn, filters["until"])
        pause = args.batch / args.rate if args.rate else 0.0
        while True:
            step = min(args.batch, args.max - total) if args.max else args.batch
            replayed = operations.replay_batch(conn, filters, step)
            total += replayed
            if replayed:
                print(f"replayed {total} so far", file=sys.stderr)
            if replayed < step or (args.max and total >= args.max):
                break
            time.sleep(pause)  # the rate limit: whole batches, spaced out
    _emit(args, {"replayed": total}) if args.json else print(f"replayed {total} dead letters")
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        _emit(args, operations.show_config(conn))
    return 0


def cmd_config_set(args: argparse.Namespace) -> int:
    if args.key not in operations.SETTABLE:
        raise UsageError(f"KEY {args.key!r}: not a setting; one of {', '.join(sorted(operations.SETTABLE))}")
    if args.key == "retry_schedule":
        try:
            RetrySchedule.from_json(json.loads(args.value), 0.0)
        except (ValueError, TypeError, AttributeError) as exc:
            raise UsageError(f"retry_schedule: {exc}") from None
    with _connect(args) as conn:
        try:
            operations.set_config(conn, args.key, None if args.value.lower() == "null" else args.value)
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            message = (exc.diag.message_primary or type(exc).__name__).splitlines()[0]
            raise UsageError(f"{args.key}: {message}") from None
    print(f"{args.key} = {args.value}")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        webhook_id = _endpoint_id(conn, args.endpoint) if args.endpoint else None
        done = operations.purge(conn, args.dead_letters_older_than, webhook_id)
    _emit(args, done)
    return 0


def cmd_keys_generate(args: argparse.Namespace) -> int:
    print(generate_key())
    return 0


def cmd_keys_status(args: argparse.Namespace) -> int:
    config = _config(args)
    keyring = _keyring(config)
    with _connect(args) as conn:
        in_use = operations.credential_keys(conn)
        unbound = operations.unbound_credentials(conn, keyring)
    missing = keyring.missing(in_use)
    # unbound: plaintext, or sealed before values were bound to their endpoint (`keys rotate` binds)
    report = {"primary_key": keyring.primary_id, "held_keys": list(keyring.key_ids),
              "credentials_by_key": in_use, "missing_keys": missing, "unbound_credentials": unbound}
    _emit(args, report)
    if missing:
        print(f"webhook-worker: credentials sealed with {', '.join(missing)} cannot be opened with "
              "these keys", file=sys.stderr)
        return EXIT_USAGE  # the keys given are configuration, and wrong
    return 0


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    config = _config(args)
    keyring = _keyring(config)
    with _connect(args) as conn:
        missing = keyring.missing(operations.credential_keys(conn))
        if missing:
            raise UsageError(
                f"credentials are sealed with {', '.join(missing)}, which these keys do not include: "
                "list the new key first and every old key after it")
        changed = operations.reseal_credentials(conn, keyring)
        in_use = operations.credential_keys(conn)
    if args.json:
        print(json.dumps({"primary_key": keyring.primary_id, "endpoints_changed": changed,
                          "credentials_by_key": in_use}))
    else:
        print(f"{changed} endpoints re-sealed; every credential is now sealed with key {keyring.primary_id}")
        print("once every worker runs with the new key first, the old keys can be removed")
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    from worker.api.app import serve as serve_api

    config = _config(args)
    configure_logging(config.logging.level, config.logging.format)
    asyncio.run(serve_api(config))
    return 0


def cmd_tokens_create(args: argparse.Namespace) -> int:
    from worker.api import tokens

    problem = tokens.name_problem(args.name)
    if problem is not None:
        raise UsageError(f"--name: {problem}")
    if args.tenant is not None and args.role == "admin":
        # admin requests change things through SECURITY DEFINER functions, which keep to no tenant
        raise UsageError("--tenant: only producer and reader tokens can be scoped to a tenant")
    if args.expires_in is not None and not 0 < args.expires_in <= 3650:
        raise UsageError("--expires-in: expected a number of days above 0, at most 3650")
    expires_at = datetime.now(UTC) + timedelta(days=args.expires_in) if args.expires_in else None
    with _connect(args) as conn:
        try:
            token = tokens.create(conn, args.name, args.role, expires_at, args.tenant)
        except psycopg.errors.UniqueViolation:
            raise CommandFailed(f"--name {args.name!r}: a token with this name exists") from None
        except psycopg.errors.NoDataFound:
            raise UsageError(f"--tenant: no tenant named {args.tenant!r} (tenants list shows them)") from None
    if args.json:
        print(json.dumps({"name": args.name, "role": args.role, "tenant": args.tenant,
                          "expires_at": expires_at, "token": token}, default=str))
        return 0
    until = f", expires {expires_at:%Y-%m-%d %H:%M:%S} UTC" if expires_at else ""
    # the token alone on standard output, so `TOKEN=$(webhook-worker tokens create …)` captures it
    print(f"token {args.name} created (role {args.role}{until}); shown once, store it now:", file=sys.stderr)
    print(token)
    return 0


def cmd_operations_list(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        rows = operations.bulk_operations(conn, args.limit)
    _emit(args, rows, ["id", "kind", "status", "processed", "max_rows", "rate", "requested_by",
                       "cancelled_by", "created_at", "finished_at"])
    return 0


def cmd_operations_cancel(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        status = operations.cancel_operation(conn, args.id, "cli")
    if status is None:
        raise CommandFailed(f"ID {args.id}: no operation with this id")
    if status != "cancelled":
        raise CommandFailed(f"operation {args.id} is {status} already: nothing to cancel")
    print(f"operation {args.id} cancelled")
    return 0


def cmd_tokens_list(args: argparse.Namespace) -> int:
    from worker.api import tokens

    with _connect(args) as conn:
        rows = tokens.listing(conn)
    _emit(args, rows, ["name", "role", "tenant", "state", "created_at", "expires_at", "revoked_at"])
    return 0


def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    from worker.api import tokens

    with _connect(args) as conn:
        if not tokens.revoke(conn, args.name):
            raise CommandFailed(f"NAME {args.name!r}: no active token with this name")
    print(f"token {args.name} revoked")
    return 0


def _tenant_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The limits given as options; `none` clears one."""
    from worker import tenants

    return {key: getattr(args, key) for key in tenants.LIMIT_OPTIONS if getattr(args, key) is not _UNSET}


def _limit_value(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if text.lower() == "none":
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a number' if kind is float else 'an integer'} "
                                             "or none") from None
    return parse


_UNSET = object()


def cmd_tenants_add(args: argparse.Namespace) -> int:
    from worker import tenants

    with _connect(args) as conn:
        try:
            tenant_id = tenants.add(conn, args.name, _tenant_limits(args))
        except tenants.InvalidTenant as exc:
            raise UsageError(str(exc)) from None
        except psycopg.errors.UniqueViolation:
            raise CommandFailed(f"NAME {args.name!r}: a tenant with this name exists") from None
    _emit(args, {"id": tenant_id, "name": args.name}) if args.json else print(tenant_id)
    return 0


def cmd_tenants_update(args: argparse.Namespace) -> int:
    from worker import tenants

    limits = _tenant_limits(args)
    if not limits:
        raise UsageError("nothing to change: give at least one limit")
    with _connect(args) as conn:
        try:
            tenants.update(conn, args.name, limits)
        except tenants.InvalidTenant as exc:
            raise UsageError(str(exc)) from None
        except psycopg.errors.NoDataFound:
            raise CommandFailed(f"NAME {args.name!r}: no tenant with this name") from None
    print(f"tenant {args.name} updated")
    return 0


def cmd_tenants_list(args: argparse.Namespace) -> int:
    from worker import tenants

    with _connect(args) as conn:
        rows = tenants.listing(conn)
    _emit(args, rows, ["id", "name", "rate_limit_per_second", "max_in_flight", "max_endpoints", "max_queued",
                       "endpoints", "waiting", "in_flight", "dead_letters"])
    return 0


def cmd_tenants_show(args: argparse.Namespace) -> int:
    from worker import tenants

    with _connect(args) as conn:
        row = tenants.show(conn, args.name)
    if row is None:
        raise CommandFailed(f"NAME {args.name!r}: no tenant with this name")
    _emit(args, row)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from worker.demo import run_demo

    alerts: int = args.alerts
    return run_demo(alerts=alerts)


BODY_FORMATS = ["raw", "envelope", "slack", "mattermost", "pagerduty"]
FROM_FILE = "read {} from FILE ('-': standard input), keeping it out of the process list and shell history"


OPERATIONAL_ALL_TENANTS_HELP = ("receive the operational events (webhook.*) of every tenant's endpoints, "
                                "not only of its own tenant's: the operator's channel")


def add_header_options(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--header", action="append", metavar="'NAME: VALUE'", help=text)
    parser.add_argument("--header-file", metavar="FILE",
                        help=FROM_FILE.format("headers, one 'Name: value' a line,"))


def add_routing_key_options(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--routing-key", help="PagerDuty integration key (with --format pagerduty)")
    source.add_argument("--routing-key-file", metavar="FILE", help=FROM_FILE.format("the routing key"))


def build_parser() -> argparse.ArgumentParser:
    config_help = "YAML config file (DATABASE_URL and WEBHOOK_WORKER_* variables override it)"
    parser = argparse.ArgumentParser(
        prog="webhook-worker",
        description="Deliver webhooks queued in PostgreSQL. Without a command, runs the worker.",
    )
    parser.add_argument("--version", action="version", version=f"webhook-worker {__version__}")
    parser.add_argument("--config", metavar="FILE", help=config_help)
    parser.set_defaults(handler=cmd_run)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(
        parent: Any, name: str, handler: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = parent.add_parser(name, help=help_, description=help_)
        sub.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=config_help)
        sub.set_defaults(handler=handler)
        return sub

    def group(name: str, help_: str, description: str) -> Any:
        """A command with subcommands; given alone, it prints its help rather than falling through
        to the top level's default (which runs the worker)."""
        parser_: argparse.ArgumentParser = commands.add_parser(name, help=help_, description=description)

        def print_help(_args: argparse.Namespace) -> int:
            parser_.print_help()
            return EXIT_USAGE

        parser_.set_defaults(handler=print_help)
        return parser_.add_subparsers(title="commands", metavar="COMMAND")

    command(commands, "run", cmd_run, "run the worker until SIGTERM or SIGINT (the default)")
    command(commands, "migrate", cmd_migrate, "apply the schema migrations (safe to run concurrently)")

    endpoint_commands = group("endpoints", "register and list endpoints", "Register and list endpoints.")
    add = command(endpoint_commands, "add", cmd_endpoints_add, "register an endpoint; prints its id")
    add.add_argument("--name", required=True, help="unique name")
    url_source = add.add_mutually_exclusive_group(required=True)
    url_source.add_argument("--url", help="where to POST (kept out of logs; visible in the process list: "
                            "prefer --url-file)")
    url_source.add_argument("--url-file", metavar="FILE", help=FROM_FILE.format("the URL"))
    add.add_argument("--event-type", action="append", metavar="TYPE",
                     help="subscribe to this event type (repeatable; default: all)")
    add_header_options(add, "custom request header (repeatable)")
    secret_source = add.add_mutually_exclusive_group()
    secret_source.add_argument("--secret", help="signing secret whsec_<base64> (default: generated)")
    secret_source.add_argument("--secret-file", metavar="FILE", help=FROM_FILE.format("the signing secret"))
    add.add_argument("--max-attempts", type=int, help="override the global max attempts")
    add.add_argument("--timeout-seconds", type=float, help="override the request timeout")
    add.add_argument("--retry-delays", metavar="S,S,...", help="override the retry delays (seconds)")
    add.add_argument("--rate-limit", type=float, metavar="PER_SECOND",
                     help="at most this many requests per second, fleet-wide")
    add.add_argument("--burst", type=int, help="requests allowed at once above the rate")
    add.add_argument("--max-in-flight", type=int, help="at most this many requests open at once, fleet-wide")
    add.add_argument("--format", choices=BODY_FORMATS,
                     default="raw", help="request body: the payload as queued (raw, the default), the "
                     "Standard Webhooks envelope, or a Slack, Mattermost or PagerDuty Events v2 message")
    add_routing_key_options(add)
    add.add_argument("--ttl-seconds", type=float, help="deliveries not delivered within this long expire")
    add_coalescing_options(add)
    add.add_argument("--tenant", metavar="NAME", help="the tenant it belongs to (default: default)")
    add.add_argument("--operational-all-tenants", action="store_true",
                     help=OPERATIONAL_ALL_TENANTS_HELP)
    add.add_argument("--verify", action="store_true",
                     help="send a challenge first; the endpoint is enabled only if the receiver echoes it")
    add.add_argument("--json", action="store_true", help="print JSON")
    enable = command(endpoint_commands, "enable", cmd_endpoints_enable,
                     "enable an endpoint (and reset its circuit); its waiting rows are sent")
    enable.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    disable = command(endpoint_commands, "disable", cmd_endpoints_disable,
                      "disable an endpoint: no new deliveries, queued rows wait")
    disable.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    disable.add_argument("--reason", default="disabled by an operator", help="recorded with the change")
    circuit = command(endpoint_commands, "circuit", cmd_endpoints_circuit,
                      "control the circuit breaker: reset, open (until a time) or close")
    circuit.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    circuit.add_argument("action", choices=["reset", "open", "close"],
                         help="reset: closed and counters cleared; open: nothing sent (until --until, "
                              "or until reset); close: never opens by itself until reset")
    circuit.add_argument("--until", metavar="TIMESTAMP", help="with open: when to start probing again")
    listing = command(endpoint_commands, "list", cmd_endpoints_list, "list endpoints and health")
    listing.add_argument("--json", action="store_true", help="print JSON")
    show = command(endpoint_commands, "show", cmd_endpoints_show,
                   "one endpoint: settings, health, circuit, queued rows, recent state changes")
    show.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    show.add_argument("--json", action="store_true", help="print JSON")
    update = command(endpoint_commands, "update", cmd_endpoints_update, "change an endpoint's settings")
    update.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    new_url = update.add_mutually_exclusive_group()
    new_url.add_argument("--url", help="new URL (kept out of logs; prefer --url-file)")
    new_url.add_argument("--url-file", metavar="FILE", help=FROM_FILE.format("the new URL"))
    update.add_argument("--event-type", action="append", metavar="TYPE", help="replace the subscriptions")
    add_header_options(update, "replace the headers (repeatable)")
    for option, kind, text in (("--max-attempts", int, "max attempts"),
                               ("--timeout-seconds", float, "request timeout"),
                               ("--rate-limit", float, "requests per second"),
                               ("--burst", int, "burst above the rate"),
                               ("--max-in-flight", int, "requests open at once")):
        update.add_argument(option, type=kind, help=text)
    update.add_argument("--retry-delays", metavar="S,S,...", help="retry delays (seconds)")
    update.add_argument("--format", choices=BODY_FORMATS, help="request body format (see `endpoints add`)")
    add_routing_key_options(update)
    update.add_argument("--ttl-seconds", type=float, help="deliveries not delivered within this long expire")
    add_coalescing_options(update)
    update.add_argument("--operational-all-tenants", action=argparse.BooleanOptionalAction,
                        help=OPERATIONAL_ALL_TENANTS_HELP + "; --no-operational-all-tenants: its own "
                             "tenant's only")
    rotate = command(endpoint_commands, "rotate-secret", cmd_endpoints_rotate_secret,
                     "add a new signing secret; the old ones stay active until --expire-old-after")
    rotate.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    new_secret = rotate.add_mutually_exclusive_group()
    new_secret.add_argument("--secret", help="the new secret, whsec_<base64> (default: generated)")
    new_secret.add_argument("--secret-file", metavar="FILE", help=FROM_FILE.format("the new secret"))
    rotate.add_argument("--expire-old-after", type=float, metavar="HOURS",
                        help="the current secrets stop being used this many hours from now")
    rotate.add_argument("--json", action="store_true", help="print JSON")

    enqueue = command(commands, "enqueue", cmd_enqueue, "queue one delivery by hand, to test an endpoint")
    enqueue.add_argument("--endpoint", required=True, help="id (all digits) or name")
    enqueue.add_argument("--event-type", default="webhook.test", help="default: webhook.test")
    enqueue.add_argument("--payload", default='{"test": true}', help="JSON body")
    enqueue.add_argument("--key", help="idempotency key (default: a new event id)")
    enqueue.add_argument("--json", action="store_true", help="print JSON")

    status = command(commands, "status", cmd_status,
                     "queue counts by status, oldest due, rows held back, endpoint health and circuits")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--tenant", metavar="NAME", help="only this tenant's rows and endpoints")

    delivery_commands = group("deliveries", "look up deliveries", "Look up deliveries.")
    show_delivery = command(delivery_commands, "show", cmd_deliveries_show,
                            "a delivery (by id, or every endpoint's by --key) with its attempt history")
    show_delivery.add_argument("id", nargs="?", type=int, help="delivery id")
    show_delivery.add_argument("--key", help="idempotency key instead of an id")
    show_delivery.add_argument("--json", action="store_true", help="print JSON")

    def add_filters(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--endpoint", help="id (all digits) or name")
        sub.add_argument("--event-type")
        sub.add_argument("--category", choices=CATEGORIES, metavar="CATEGORY",
                         help=f"failure category: {', '.join(CATEGORIES)}")
        sub.add_argument("--since", metavar="TIMESTAMP", help="dead-lettered at or after")
        sub.add_argument("--until", metavar="TIMESTAMP", help="dead-lettered before")
        sub.add_argument("--tenant", metavar="NAME", help="only this tenant's dead letters")

    dlq_commands = group("dlq", "the dead letters", "The dead letters.")
    dlq_list = command(dlq_commands, "list", cmd_dlq_list, "list dead letters, oldest first")
    add_filters(dlq_list)
    dlq_list.add_argument("--limit", type=int, default=100, help="default 100")
    dlq_list.add_argument("--json", action="store_true", help="print JSON")

    replay = command(commands, "replay", cmd_replay,
                     "send a delivery again (same webhook-id), or --all dead letters matching filters")
    replay.add_argument("id", nargs="?", type=int, help="delivery id")
    replay.add_argument("--all", action="store_true", help="every dead letter matching the filters")
    add_filters(replay)
    replay.add_argument("--batch", type=int, default=100, help="rows per step (default 100)")
    replay.add_argument("--rate", type=float, help="at most this many rows per second")
    replay.add_argument("--max", type=int, help="stop after this many")
    replay.add_argument("--json", action="store_true", help="print JSON")

    operation_commands = group("operations", "bulk replays started over the HTTP API",
                               "Bulk replays started over the HTTP API (POST /v1/dead-letters/replay).")
    operations_list = command(operation_commands, "list", cmd_operations_list,
                              "list operations, newest first")
    operations_list.add_argument("--limit", type=int, default=50, help="default 50")
    operations_list.add_argument("--json", action="store_true", help="print JSON")
    operations_cancel = command(operation_commands, "cancel", cmd_operations_cancel,
                                "stop a running operation after the step it is in")
    operations_cancel.add_argument("id", metavar="ID", type=int, help="operation id")

    config_commands = group("config", "the fleet-wide defaults in webhooks.delivery_config",
                            "The fleet-wide defaults in webhooks.delivery_config.")
    config_show = command(config_commands, "show", cmd_config_show, "print the defaults")
    config_show.add_argument("--json", action="store_true", help="print JSON")
    config_set = command(config_commands, "set", cmd_config_set, "change one default (workers pick it up)")
    config_set.add_argument("key", metavar="KEY")
    config_set.add_argument("value", metavar="VALUE", help="'null' resets a nullable default")

    purge_parser = command(commands, "purge", cmd_purge,
                           "apply retention now; with --dead-letters-older-than, also drop dead letters")
    purge_parser.add_argument("--dead-letters-older-than", metavar="INTERVAL",
                              help="e.g. '30 days'; dead letters are otherwise kept until replayed")
    purge_parser.add_argument("--endpoint", help="only this endpoint's dead letters")
    purge_parser.add_argument("--json", action="store_true", help="print JSON")

    key_commands = group(
        "keys", "the encryption keys that seal endpoint credentials",
        "The encryption keys that seal endpoint URLs and secrets in the database. Keys come from "
        "WEBHOOK_WORKER_ENCRYPTION_KEYS or security.encryption_keys_file: the first seals, all open.")
    command(key_commands, "generate", cmd_keys_generate, "print a new random key (32 bytes, base64)")
    key_status = command(key_commands, "status", cmd_keys_status,
                         "which keys sealed the stored credentials, and whether these keys open them all")
    key_status.add_argument("--json", action="store_true", help="print JSON")
    key_rotate = command(key_commands, "rotate", cmd_keys_rotate,
                         "re-seal every stored credential with the first key (workers keep running)")
    key_rotate.add_argument("--json", action="store_true", help="print JSON")

    command(commands, "api", cmd_api,
            "serve the HTTP API (/v1) and the console on api.host:api.port until SIGTERM or SIGINT")
    token_commands = group("tokens", "the HTTP API's tokens",
                           "The HTTP API's tokens: only a hash is stored; a token is shown once.")
    token_create = command(token_commands, "create", cmd_tokens_create,
                           "create a token; prints it once, alone on standard output")
    token_create.add_argument("--name", required=True, help="unique name (shown in lists, never secret)")
    token_create.add_argument("--role", required=True, choices=["producer", "reader", "admin"],
                              help="producer: publish only; reader: every read; admin: everything")
    token_create.add_argument("--expires-in", type=float, metavar="DAYS", help="stops working after this")
    token_create.add_argument("--tenant", metavar="NAME",
                              help="producer or reader token that sees and changes only this tenant's rows")
    token_create.add_argument("--json", action="store_true", help="print JSON")
    token_list = command(token_commands, "list", cmd_tokens_list, "list tokens (never the tokens themselves)")
    token_list.add_argument("--json", action="store_true", help="print JSON")
    token_revoke = command(token_commands, "revoke", cmd_tokens_revoke, "revoke a token: it stops at once")
    token_revoke.add_argument("name", metavar="NAME")

    tenant_commands = group("tenants", "tenants: the teams or customers this deployment serves",
                            "Tenants and their fleet-wide limits (`none` clears a limit).")

    def tenant_limit_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--rate-limit", dest="rate_limit_per_second", type=_limit_value(float),
                         default=_UNSET, metavar="PER_SECOND",
                         help="requests per second across its endpoints")
        sub.add_argument("--burst", dest="rate_limit_burst", type=_limit_value(int), default=_UNSET,
                         help="requests allowed at once above the rate")
        sub.add_argument("--max-in-flight", type=_limit_value(int), default=_UNSET,
                         help="at most this many requests open at once, fleet-wide")
        sub.add_argument("--max-endpoints", type=_limit_value(int), default=_UNSET,
                         help="registering more endpoints is refused")
        sub.add_argument("--max-queued", type=_limit_value(int), default=_UNSET,
                         help="publishing over the API beyond this many unfinished rows gets 429 "
                              "(SQL producers are never refused)")

    tenant_add = command(tenant_commands, "add", cmd_tenants_add, "add a tenant; prints its id")
    tenant_add.add_argument("name", metavar="NAME")
    tenant_limit_options(tenant_add)
    tenant_add.add_argument("--json", action="store_true", help="print JSON")
    tenant_update = command(tenant_commands, "update", cmd_tenants_update, "change a tenant's limits")
    tenant_update.add_argument("name", metavar="NAME")
    tenant_limit_options(tenant_update)
    tenant_list = command(tenant_commands, "list", cmd_tenants_list, "list tenants, their limits and rows")
    tenant_list.add_argument("--json", action="store_true", help="print JSON")
    tenant_show = command(tenant_commands, "show", cmd_tenants_show, "one tenant, its limits and rows")
    tenant_show.add_argument("name", metavar="NAME")
    tenant_show.add_argument("--json", action="store_true", help="print JSON")

    demo = commands.add_parser(
        "demo", help="deliver sample alerts end to end on a local PostgreSQL and receiver",
        description="Start a throwaway PostgreSQL (unless DATABASE_URL is set), migrate, register a "
        "receiver on 127.0.0.1, enqueue sample alerts, deliver them and print the audit rows.",
    )
    demo.add_argument("--alerts", type=int, default=5, help="how many sample alerts (default 5)")
    demo.set_defaults(handler=cmd_demo)
    return parser


def _first_line(exc: psycopg.Error) -> str:
    """The server's primary message only: its DETAIL may quote a whole row, credentials included."""
    message = exc.diag.message_primary or str(exc).strip() or type(exc).__name__
    return message.splitlines()[0]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        print(f"webhook-worker: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"webhook-worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CommandFailed as exc:
        print(f"webhook-worker: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.OperationalError as exc:
        first_line = (str(exc).strip().splitlines() or ["connection failed"])[0]
        print(f"webhook-worker: database unreachable: {first_line}", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.errors.DataError as exc:  # SQLSTATE class 22: a value given was unusable
        print(f"webhook-worker: invalid value: {_first_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except psycopg.Error as exc:
        print(f"webhook-worker: the database refused: {_first_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
