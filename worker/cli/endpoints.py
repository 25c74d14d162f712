"""`webhook-worker endpoints …`: register, change, list and show endpoints; enable, disable, circuit.
Registration and changes go through worker.rules.endpoints (the service the API calls too); this module
reads the command line into its models and names its fields as options (FLAGS)."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import psycopg

from worker import __version__, names
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
    run_async,
)
from worker.config import Config
from worker.encryption import Keyring, KeyringError
from worker.rules import endpoints as service
from worker.rules import event_types, self_service, signing
from worker.rules.destinations import Address
from worker.rules.model import Sent
from worker.rules.registration import header_problem
from worker.store import database
from worker.store import deliveries as delivery_store
from worker.store import endpoints as endpoint_store
from worker.store import event_types as catalogue_store
from worker.tables import cell, print_table

FROM_FILE = "read {} from FILE ('-': standard input), keeping it out of the process list and shell history"
OPERATIONAL_ALL_TENANTS_HELP = ("receive the operational events (webhook.*) of every tenant's endpoints, "
                                "not only of its own tenant's: the operator's channel")
# The one table from the service's field names to this command's options, where they differ
# (any other field F is --F with dashes): errors name the option a user typed.
FLAGS = {"rate_limit_per_second": "--rate-limit", "rate_limit_burst": "--burst", "body_format": "--format",
         "event_types": "--event-type", "headers": "--header"}
# Fields read by hand: credentials also come from files, lists are repeated options or commas.
SPECIAL = {"name", "url", "secret", "routing_key", "event_types", "headers", "retry_delays", "body_format",
           "operational_all_tenants"}


def option(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def plain_fields() -> dict[str, type]:
    """The fields that are one number or one text (every field of the model but SPECIAL and the
    read-only ones): each gets its option on `add` and `update` from the model, type and help."""
    found: dict[str, type] = {}
    for name, info in service.EndpointFields.model_fields.items():
        kinds = [kind for kind in get_args(info.annotation) if kind is not type(None)]
        if name not in SPECIAL and len(kinds) == 1 and kinds[0] in (int, float, str):
            found[name] = kinds[0]
    return found


def add_plain_options(parser: argparse.ArgumentParser) -> None:
    for name, kind in plain_fields().items():
        info = service.EndpointFields.model_fields[name]
        metavar = {int: "N", float: "NUMBER", str: "TEXT"}[kind]
        parser.add_argument(option(name), dest=name, type=kind, metavar=metavar,
                            help=in_options(info.description or ""))


def in_options(text: str) -> str:
    """The service's text with the fields it names (those with an underscore) named as options."""
    for field in sorted(service.EndpointFields.model_fields, key=len, reverse=True):
        if "_" in field:
            text = text.replace(field, option(field))
    return text


def usage(problem: service.EndpointProblem) -> Exception:
    """The service's problem as this command says it: options for fields; a conflict is not a usage
    error (exit 1, not 2)."""
    detail = in_options(problem.detail)
    if problem.hint:
        detail += f"; to deliver there, {_with_config(problem.hint)}"
    message = detail if problem.field == "(body)" else f"{option(problem.field)}: {detail}"
    return CommandFailed(message) if problem.conflict else UsageError(message)


def allow_networks_hint(problem: str, address: Address | None) -> str:
    """How to allow a refused private address, for a message that says it was refused."""
    hint = service.allow_networks_hint(problem, address)
    return f"; to deliver there, {_with_config(hint)}" if hint else ""


def _with_config(hint: str) -> str:
    """A hint that names the config file names the one this command reads."""
    return f"{hint} given with --config" if hint.endswith("the config file") else hint


def _check_routing_key(body_format: str | None, routing_key: str | None, stored_format: str | None = None,
                       stored_key: bool = False) -> None:
    try:
        service.check_routing_key(body_format, routing_key, stored_format, stored_key)
    except service.EndpointProblem as problem:
        raise usage(problem) from None


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


async def verify_endpoint(url: str, secret: str, seconds: float, config: Config,
                    scope: service.DestinationScope) -> str | None:
    """POST a signed challenge; None if the receiver echoed it in a 2xx answer, else the problem.
    Sent by the workers' own HTTP stack, so the same destination rules apply (those of the
    endpoint's tenant)."""
    from worker.daemon.worker import sender_for

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
            return await sender.post(url, body, headers, seconds, seconds, scope.rules(config))
        finally:
            await sender.close()

    sent = await post()
    if sent.result.status is None:
        return f"no answer ({sent.result.error or sent.result.failure})"
    if not 200 <= sent.result.status < 300:
        return f"HTTP {sent.result.status}"
    return None if challenge in (sent.excerpt or "") else "the answer did not contain the challenge"




def _retry_delays(delays: str) -> list[float]:
    try:
        return [float(d) for d in delays.split(",")]
    except ValueError:
        raise UsageError("--retry-delays: expected 1 to 100 delays of 0 to 604800 seconds, "
                         "separated by commas") from None


def _given(args: argparse.Namespace, inputs: SecretInputs) -> dict[str, Any]:
    """What the command line gives, by the service's field names."""
    data: dict[str, Any] = {name: getattr(args, name) for name in plain_fields()
                            if getattr(args, name) is not None}
    special = {"url": inputs.value(args, "url"), "event_types": args.event_type,
               "headers": _headers(args, inputs), "body_format": args.format,
               "retry_delays": _retry_delays(args.retry_delays) if args.retry_delays else None,
               "routing_key": inputs.value(args, "routing_key"),
               "operational_all_tenants": args.operational_all_tenants}
    if "secret" in args:
        special["secret"] = inputs.value(args, "secret")
    if "name" in args:
        special["name"] = args.name
    data.update({name: value for name, value in special.items() if value is not None})
    return data


def _check_destination(url: str | None, config: Config, scope: service.DestinationScope) -> None:
    if url is None:
        return
    try:
        # the operator runs the CLI: a refusal says how to allow the address
        warning = service.check_destination(url, config, scope, True, names.addresses)
    except service.EndpointProblem as problem:
        raise usage(problem) from None
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


@run_async
async def cmd_endpoints_add(args: argparse.Namespace) -> int:
    config = config_of(args)
    keyring = keyring_of(config)
    data = _given(args, SecretInputs())
    if "url" not in data:
        raise UsageError("--url or --url-file: required")
    if not data.get("operational_all_tenants"):
        data.pop("operational_all_tenants", None)
    try:
        body = service.parse(service.EndpointCreate, data)
        async with database.connect(config.database.url) as conn:
            scope = await endpoint_store.destination_scope(conn, args.tenant)
            assert scope is not None  # (a tenant, or NoDataFound: every registration has one)
            _check_destination(body.url, config, scope)
            registered = await endpoint_store.register(conn, body, keyring, tenant=args.tenant,
                                                       active=not args.verify)
            if args.verify:
                problem = await verify_endpoint(body.url, registered.signing_secret, 10.0, config, scope)
                if problem:
                    print(f"endpoint {registered.id} registered but left disabled: verification failed: "
                          f"{problem}", file=sys.stderr)
                    return EXIT_FAILURE
                await endpoint_store.set_active(conn, registered.id, True, "")
    except service.EndpointProblem as problem:
        raise usage(problem) from None
    if args.json:
        print(json.dumps({"id": registered.id, "name": registered.name,
                          "signing_secret": registered.signing_secret}))
    else:
        print(f"endpoint {registered.id} created: {registered.name} → {registered.url_display}")
        print(f"signing secret (shown once, give it to the receiver): {registered.signing_secret}")
    return 0


@run_async
async def cmd_endpoints_update(args: argparse.Namespace) -> int:
    config = config_of(args)
    keyring = keyring_of(config)
    data = _given(args, SecretInputs())
    if not data:
        raise UsageError("nothing to change: give at least one option")
    try:
        body = service.parse(service.EndpointUpdate, data)
        async with connect(args) as conn:
            endpoint_id = await endpoint_ref(conn, args.endpoint)
            if body.url is not None:
                # where the endpoint's tenant may deliver
                scope = await endpoint_store.destination_scope(conn, endpoint_id=endpoint_id)
                if scope is None:
                    raise CommandFailed(f"ENDPOINT {args.endpoint!r}: no endpoint with this name or id")
                _check_destination(body.url, config, scope)
            changed = await endpoint_store.update(conn, endpoint_id, body, keyring)
    except service.EndpointProblem as problem:
        raise usage(problem) from None
    print(f"endpoint {endpoint_id} updated: {', '.join(changed)}")
    return 0


@run_async
async def cmd_endpoints_show(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        endpoint_id = await endpoint_ref(conn, args.endpoint)
        details = await endpoint_store.read(conn, endpoint_id) or {}
        details.update(await endpoint_store.activity(conn, endpoint_id))
        # subscriptions no current catalogued type matches: a typo, or a type no longer published
        details["unmatched_subscriptions"] = event_types.unmatched_of_endpoint(
            await catalogue_store.unmatched_subscriptions(conn), endpoint_id)
    if args.json:
        emit(args, details)
        return 0
    events, queued = details.pop("events"), details.pop("queued")
    unmatched = details.pop("unmatched_subscriptions")
    emit(args, details)
    print(f"queued: {', '.join(f'{k} {v}' for k, v in queued.items()) or 'nothing'}")
    if unmatched:
        print("subscriptions matching no current event type: "
              + ", ".join(f"{u['pattern']} ({u['problem']})" for u in unmatched))
    if events:
        print("\nrecent state changes:")
        print_table(["at", "change", "reason", "decided_by"],
                    [[cell(e[c]) for c in ("at", "change", "reason", "decided_by")] for e in events])
    return 0


@run_async
async def cmd_endpoints_test(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        try:
            delivery_id = await delivery_store.test_event(conn, args.endpoint)
        except self_service.RefusedTestEvent as exc:
            raise CommandFailed(f"ENDPOINT {args.endpoint!r}: {exc}") from None
    if delivery_id is None:
        raise CommandFailed(f"ENDPOINT {args.endpoint!r}: no endpoint with this name or id")
    if args.json:
        print(json.dumps({"delivery_id": delivery_id, "event_type": "webhook.test"}))
    else:
        print(f"test event queued to {args.endpoint}: delivery {delivery_id} "
              f"(webhook-worker deliveries show {delivery_id})")
    return 0


@run_async
async def cmd_endpoints_enable(args: argparse.Namespace) -> int:
    return await _set_active(args, active=True)


@run_async
async def cmd_endpoints_disable(args: argparse.Namespace) -> int:
    return await _set_active(args, active=False)


async def _set_active(args: argparse.Namespace, active: bool) -> int:
    config = config_of(args)
    async with database.connect(config.database.url) as conn:
        endpoint_id = await endpoint_ref(conn, args.endpoint)
        change = await endpoint_store.set_active(conn, endpoint_id, active, getattr(args, "reason", ""))
    state = "enabled" if active else "disabled"
    print(f"endpoint {endpoint_id} {state}" if change else f"endpoint {endpoint_id} was already {state}")
    return 0


@run_async
async def cmd_endpoints_delete(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        endpoint_id = await endpoint_ref(conn, args.endpoint)
        try:
            dropped = await endpoint_store.delete(conn, endpoint_id, args.drop_pending, "cli")
        except psycopg.errors.ObjectInUse as exc:
            hint = "" if args.drop_pending else "; --drop-pending makes the waiting ones dead letters"
            raise CommandFailed(f"{exc.diag.message_primary}{hint}") from None
    if dropped is None:
        raise CommandFailed(f"ENDPOINT {args.endpoint!r}: no endpoint with this name or id")
    if args.json:
        print(json.dumps({"id": endpoint_id, "deleted": True, "dropped": dropped}))
        return 0
    print(f"endpoint {endpoint_id} deleted; its finished rows and audit stay as history")
    if dropped:
        print(f"{dropped} waiting deliveries are dead letters now, category endpoint_deleted (not "
              "replayable): webhook-worker dlq list --category endpoint_deleted")
    return 0


@run_async
async def cmd_endpoints_circuit(args: argparse.Namespace) -> int:
    config = config_of(args)
    if args.action != "open" and args.until:
        raise UsageError("--until: only with 'open'")
    async with database.connect(config.database.url) as conn:
        endpoint_id = await endpoint_ref(conn, args.endpoint)
        change = await endpoint_store.set_circuit(conn, endpoint_id, args.action, args.until)
    print(f"endpoint {endpoint_id}: {change}")
    return 0


@run_async
async def cmd_endpoints_list(args: argparse.Namespace) -> int:
    config = config_of(args)
    try:
        keyring: Keyring | None = keyring_of(config)
    except KeyringError as exc:
        keyring = None  # the list is still useful without the keys; only the fingerprints need them
        print(f"webhook-worker: URL fingerprints not shown: {exc}", file=sys.stderr)
    async with database.connect(config.database.url) as conn:
        rows = await endpoint_store.listing(conn)
        fingerprints = await endpoint_store.url_fingerprints(conn, keyring) if keyring is not None else {}
    for row in rows:
        row["url_fingerprint"] = fingerprints.get(row["id"])
    if args.json:
        emit(args, rows)
        return 0
    columns = ["id", "name", "url_display", "url_fingerprint", "active", "event_types", "health_status",
               "circuit_state", "successes", "failures"]
    print_table(columns, [[cell(row[c]) for c in columns] for row in rows])
    return 0


@run_async
async def cmd_endpoints_rotate_secret(args: argparse.Namespace) -> int:
    keyring = keyring_of(config_of(args))
    secret = SecretInputs().value(args, "secret") or signing.generate_secret()
    if (problem := signing.secret_problem(secret)) is not None:
        raise UsageError(f"--secret: {problem}")
    expire_at = None
    if args.expire_old_after is not None:
        expire_at = datetime.now(UTC) + timedelta(hours=args.expire_old_after)
    async with connect(args) as conn:
        endpoint_id = await endpoint_ref(conn, args.endpoint)
        active = await endpoint_store.rotate_secret(conn, endpoint_id, secret, expire_at, keyring)
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
    add.add_argument("--format", choices=service.BODY_FORMATS,
                     default="raw", help="request body: the payload as queued (raw, the default), the "
                     "Standard Webhooks envelope, or a Slack, Mattermost or PagerDuty Events v2 message")
    add_routing_key_options(add)
    add.add_argument("--retry-delays", metavar="S,S,...", help="override the retry delays (seconds)")
    add_plain_options(add)
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
    delete = cli.command(endpoint_commands, "delete", cmd_endpoints_delete,
                         "delete an endpoint; its finished rows and audit stay as history (never "
                         "replayed); refused while rows wait, unless --drop-pending")
    delete.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    delete.add_argument("--drop-pending", action="store_true",
                        help="make its waiting (pending, retrying) deliveries dead letters, category "
                             "endpoint_deleted, audited and not replayable, instead of refusing")
    delete.add_argument("--json", action="store_true", help="print JSON")
    circuit = cli.command(endpoint_commands, "circuit", cmd_endpoints_circuit,
                          "control the circuit breaker: reset, open (until a time) or close")
    circuit.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    circuit.add_argument("action", choices=["reset", "open", "close"],
                         help="reset: closed and counters cleared; open: nothing sent (until --until, "
                              "or until reset); close: never opens by itself until reset")
    circuit.add_argument("--until", metavar="TIMESTAMP", help="with open: when to start probing again")
    test = cli.command(endpoint_commands, "test", cmd_endpoints_test,
                       "send a webhook.test event to this endpoint alone; prints its delivery id")
    test.add_argument("endpoint", metavar="ENDPOINT", help="id (all digits) or name")
    test.add_argument("--json", action="store_true", help="print JSON")
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
    update.add_argument("--retry-delays", metavar="S,S,...", help="retry delays (seconds)")
    update.add_argument("--format", choices=service.BODY_FORMATS,
                        help="request body format (see `endpoints add`)")
    add_routing_key_options(update)
    add_plain_options(update)
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
