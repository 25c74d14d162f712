"""`webhook-worker endpoints …`: register, change, list and show endpoints; enable, disable, circuit."""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import socket
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from worker import __version__, coalescing, operations, signing
from worker.cli.base import (
    EXIT_FAILURE,
    CommandFailed,
    Commands,
    UsageError,
    config_of,
    connect,
    emit,
    endpoint_ref,
    keyring_of,
)
from worker.config import Config
from worker.delivery import display_url
from worker.destinations import Address, address_blocked, ip_literal
from worker.encryption import Keyring, KeyringError
from worker.model import Sent
from worker.operations import (
    EndpointSpec,
    list_endpoints,
    register_endpoint,
    set_circuit,
    set_endpoint_active,
)
from worker.policy import RetrySchedule
from worker.registration import (
    endpoint_name_problem,
    header_problem,
    headers_problem,
    registration_url_problem,
)
from worker.tables import cell, print_table

BODY_FORMATS = ["raw", "envelope", "slack", "mattermost", "pagerduty"]


FROM_FILE = "read {} from FILE ('-': standard input), keeping it out of the process list and shell history"


OPERATIONAL_ALL_TENANTS_HELP = ("receive the operational events (webhook.*) of every tenant's endpoints, "
                                "not only of its own tenant's: the operator's channel")


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


def _check_ttl(ttl_seconds: float | None) -> None:
    if ttl_seconds is not None and not 0 < ttl_seconds <= 365 * 86400:
        raise UsageError("--ttl-seconds: expected a number of seconds above 0, at most a year")


def cmd_endpoints_add(args: argparse.Namespace) -> int:
    config = config_of(args)
    keyring = keyring_of(config)
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


def cmd_endpoints_enable(args: argparse.Namespace) -> int:
    return _set_active(args, active=True)


def cmd_endpoints_disable(args: argparse.Namespace) -> int:
    return _set_active(args, active=False)


def _set_active(args: argparse.Namespace, active: bool) -> int:
    config = config_of(args)
    with operations.connect(config) as conn:
        endpoint_id = endpoint_ref(conn, args.endpoint)
        change = set_endpoint_active(conn, endpoint_id, active, getattr(args, "reason", ""))
    state = "enabled" if active else "disabled"
    print(f"endpoint {endpoint_id} {state}" if change else f"endpoint {endpoint_id} was already {state}")
    return 0


def cmd_endpoints_circuit(args: argparse.Namespace) -> int:
    config = config_of(args)
    if args.action != "open" and args.until:
        raise UsageError("--until: only with 'open'")
    with operations.connect(config) as conn:
        endpoint_id = endpoint_ref(conn, args.endpoint)
        change = set_circuit(conn, endpoint_id, args.action, args.until)
    print(f"endpoint {endpoint_id}: {change}")
    return 0


def cmd_endpoints_list(args: argparse.Namespace) -> int:
    config = config_of(args)
    try:
        keyring: Keyring | None = keyring_of(config)
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


def cmd_endpoints_show(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        details = operations.show_endpoint(conn, endpoint_ref(conn, args.endpoint))
    if args.json:
        emit(args, details)
        return 0
    events, queued = details.pop("events"), details.pop("queued")
    emit(args, details)
    print(f"queued: {', '.join(f'{k} {v}' for k, v in queued.items()) or 'nothing'}")
    if events:
        print("\nrecent state changes:")
        print_table(["at", "change", "reason", "decided_by"],
                    [[cell(e[c]) for c in ("at", "change", "reason", "decided_by")] for e in events])
    return 0


def cmd_endpoints_update(args: argparse.Namespace) -> int:
    config = config_of(args)
    keyring = keyring_of(config)
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
    with connect(args) as conn:
        endpoint_id = endpoint_ref(conn, args.endpoint)
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
    keyring = keyring_of(config_of(args))
    secret = SecretInputs().value(args, "secret") or signing.generate_secret()
    _check_secret(secret)
    expire_at = None
    if args.expire_old_after is not None:
        expire_at = datetime.now(UTC) + timedelta(hours=args.expire_old_after)
    with connect(args) as conn:
        endpoint_id = endpoint_ref(conn, args.endpoint)
        active = operations.rotate_secret(conn, endpoint_id, secret, expire_at, keyring)
    if args.json:
        print(json.dumps({"id": endpoint_id, "signing_secret": secret, "secrets": active,
                          "old_expire_at": expire_at}, default=str))
        return 0
    print(f"endpoint {endpoint_id}: new signing secret (shown once): {secret}")
    until = f"until {expire_at:%Y-%m-%d %H:%M:%S} UTC" if expire_at else "until the next rotation"
    print(f"requests now carry {active} signatures; the older secrets stay active {until}")
    return 0


def add_header_options(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--header", action="append", metavar="'NAME: VALUE'", help=text)
    parser.add_argument("--header-file", metavar="FILE",
                        help=FROM_FILE.format("headers, one 'Name: value' a line,"))


def add_routing_key_options(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--routing-key", help="PagerDuty integration key (with --format pagerduty)")
    source.add_argument("--routing-key-file", metavar="FILE", help=FROM_FILE.format("the routing key"))


def add_coalescing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coalesce-max", type=int, metavar="N",
                        help="alert storms: when more rows are due than the limits let through, send up "
                             "to N as one digest request (slack, mattermost, envelope; 0 turns it off)")
    parser.add_argument("--coalesce-window", type=float, metavar="SECONDS",
                        help="with --coalesce-max: also coalesce once the oldest due row waited this long")



def register(cli: Commands) -> None:
    endpoint_commands = cli.group("endpoints", "register and list endpoints", "Register and list endpoints.")
    add = cli.command(endpoint_commands, "add", cmd_endpoints_add, "register an endpoint; prints its id")
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
    enable = cli.command(endpoint_commands, "enable", cmd_endpoints_enable,
                         "enable an endpoint (and reset its circuit); its waiting rows are sent")
    enable.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    disable = cli.command(endpoint_commands, "disable", cmd_endpoints_disable,
                          "disable an endpoint: no new deliveries, queued rows wait")
    disable.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    disable.add_argument("--reason", default="disabled by an operator", help="recorded with the change")
    circuit = cli.command(endpoint_commands, "circuit", cmd_endpoints_circuit,
                          "control the circuit breaker: reset, open (until a time) or close")
    circuit.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    circuit.add_argument("action", choices=["reset", "open", "close"],
                         help="reset: closed and counters cleared; open: nothing sent (until --until, "
                              "or until reset); close: never opens by itself until reset")
    circuit.add_argument("--until", metavar="TIMESTAMP", help="with open: when to start probing again")
    listing = cli.command(endpoint_commands, "list", cmd_endpoints_list, "list endpoints and health")
    listing.add_argument("--json", action="store_true", help="print JSON")
    show = cli.command(endpoint_commands, "show", cmd_endpoints_show,
                       "one endpoint: settings, health, circuit, queued rows, recent state changes")
    show.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    show.add_argument("--json", action="store_true", help="print JSON")
    update = cli.command(endpoint_commands, "update", cmd_endpoints_update, "change an endpoint's settings")
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
    rotate = cli.command(endpoint_commands, "rotate-secret", cmd_endpoints_rotate_secret,
                         "add a new signing secret; the old ones stay active until --expire-old-after")
    rotate.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    new_secret = rotate.add_mutually_exclusive_group()
    new_secret.add_argument("--secret", help="the new secret, whsec_<base64> (default: generated)")
    new_secret.add_argument("--secret-file", metavar="FILE", help=FROM_FILE.format("the new secret"))
    rotate.add_argument("--expire-old-after", type=float, metavar="HOURS",
                        help="the current secrets stop being used this many hours from now")
    rotate.add_argument("--json", action="store_true", help="print JSON")
