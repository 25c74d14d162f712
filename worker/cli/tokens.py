"""`tokens create|list|revoke`: the HTTP API's tokens."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta

import psycopg

from worker.cli.base import CommandFailed, Commands, UsageError, config_of, connect, emit, run_async
from worker.rules.tokens import ROLES


@run_async
async def cmd_tokens_create(args: argparse.Namespace) -> int:
    from worker.rules import tokens
    from worker.store import tokens as token_store

    problem = tokens.name_problem(args.name)
    if problem is not None:
        raise UsageError(f"--name: {problem}")
    problem = tokens.scope_problem(args.role, args.tenant)
    if problem is not None:
        raise UsageError(f"--tenant: {problem}")
    if args.expires_in is not None and not 0 < args.expires_in <= tokens.MAX_EXPIRES_DAYS:
        raise UsageError("--expires-in: expected a number of days above 0, at most "
                         f"{tokens.MAX_EXPIRES_DAYS}")
    expires_at = datetime.now(UTC) + timedelta(days=args.expires_in) if args.expires_in else None
    async with connect(args) as conn:
        try:
            token = await token_store.create(conn, args.name, args.role, expires_at, args.tenant)
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


@run_async
async def cmd_tokens_list(args: argparse.Namespace) -> int:
    from worker.store import tokens as token_store

    async with connect(args) as conn:
        rows = await token_store.listing(conn)
    emit(args, rows, ["name", "role", "tenant", "state", "created_at", "expires_at", "revoked_at"])
    return 0


@run_async
async def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    from worker.store import tokens as token_store

    async with connect(args) as conn:
        if not await token_store.revoke(conn, args.name):
            raise CommandFailed(f"NAME {args.name!r}: no active token with this name")
    print(f"token {args.name} revoked")
    return 0


@run_async
async def cmd_tokens_portal_link(args: argparse.Namespace) -> int:
    from worker.rules import portal
    from worker.store import tenants as tenant_store

    try:
        lifetime = portal.parse_lifetime(args.expires_in)
    except ValueError as exc:
        raise UsageError(f"--expires-in: {exc}") from None
    base = args.base_url
    if base is not None:
        problem = portal.base_url_problem(base)
        if problem is not None:
            raise UsageError(f"--base-url: {problem}")
        base = portal.origin(base)
    else:
        api = config_of(args).api
        base = api.public_url
        if base is None:
            host = "127.0.0.1" if api.host in ("0.0.0.0", "::") else api.host
            base = f"http://{f'[{host}]' if ':' in host else host}:{api.port}"
            print(f"warning: the link points at {base} (api.host and api.port): set api.public_url to "
                  "where people reach the API, or give --base-url", file=sys.stderr)
    async with connect(args) as conn:
        try:
            link = await tenant_store.create_portal_link(conn, args.tenant, lifetime, base)
        except psycopg.errors.NoDataFound:
            raise CommandFailed(f"--tenant: no tenant named {args.tenant!r} (tenants list shows them)"
                                ) from None
    if args.json:
        print(json.dumps({"url": link.url, "tenant": link.tenant, "token_name": link.token_name,
                          "expires_at": link.expires_at}, default=str))
        return 0
    # the link alone on standard output, so `LINK=$(webhook-worker tokens portal-link …)` captures it
    print(f"portal link for tenant {link.tenant} (opens once, until {link.expires_at:%Y-%m-%d %H:%M:%S %Z}; "
          f"`tokens revoke {link.token_name}` ends it); shown once:", file=sys.stderr)
    print(link.url)
    return 0


def register(cli: Commands) -> None:
    token_commands = cli.group("tokens", "the HTTP API's tokens",
                               "The HTTP API's tokens: only a hash is stored; a token is shown once.")
    token_create = cli.command(token_commands, "create", cmd_tokens_create,
                               "create a token; prints it once, alone on standard output")
    token_create.add_argument("--name", required=True, help="unique name (shown in lists, never secret)")
    token_create.add_argument("--role", required=True,
                              choices=ROLES,
                              help="producer: publish only; reader: every read; admin: everything; "
                                   "tenant_admin: what admin does to one tenant's endpoints, deliveries "
                                   "and dead letters (with --tenant)")
    token_create.add_argument("--expires-in", type=float, metavar="DAYS", help="stops working after this")
    token_create.add_argument("--tenant", metavar="NAME",
                              help="the tenant a producer, reader or tenant_admin token sees and changes "
                                   "alone (required for tenant_admin)")
    token_create.add_argument("--json", action="store_true", help="print JSON")
    token_list = cli.command(token_commands, "list", cmd_tokens_list,
                             "list tokens (never the tokens themselves)")
    token_list.add_argument("--json", action="store_true", help="print JSON")
    token_revoke = cli.command(token_commands, "revoke", cmd_tokens_revoke,
                               "revoke a token: it stops at once")
    token_revoke.add_argument("name", metavar="NAME")
    portal_link = cli.command(token_commands, "portal-link", cmd_tokens_portal_link,
                              "a one-time console link for a tenant's administrator; prints it once")
    portal_link.add_argument("--tenant", required=True, metavar="NAME",
                             help="the tenant the link administers")
    portal_link.add_argument("--expires-in", default="1h", metavar="DURATION",
                             help="the link, and the session it opens, end after this (30m, 1h; at most 1d)")
    portal_link.add_argument("--base-url", metavar="URL",
                             help="where people reach the API, e.g. https://webhooks.example.com "
                                  "(default: api.public_url, else api.host and api.port)")
    portal_link.add_argument("--json", action="store_true", help="print JSON")
