"""`tenants add|update|list|show`: the teams or customers a deployment serves, their limits, and
the private networks their endpoints may reach."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import psycopg

from worker.cli.base import CommandFailed, Commands, UsageError, connect, emit, run_async

_UNSET = object()


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


def _networks(text: str) -> list[str] | None:
    """--allow-networks: CIDRs separated by commas; `none` grants none."""
    if text.strip().lower() == "none":
        return None
    return [entry for entry in text.split(",") if entry.strip()] or None


def _tenant_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The limits given as options; `none` clears one."""
    from worker.rules import tenants

    return {key: getattr(args, key) for key in tenants.LIMIT_OPTIONS if getattr(args, key) is not _UNSET}


@run_async
async def cmd_tenants_add(args: argparse.Namespace) -> int:
    from worker.rules import tenants
    from worker.store import tenants as tenant_store

    async with connect(args) as conn:
        try:
            tenants.check(args.name, _tenant_limits(args))
            tenant_id = await tenant_store.add(conn, args.name, _tenant_limits(args))
        except tenants.InvalidTenant as exc:
            raise UsageError(str(exc)) from None
        except psycopg.errors.UniqueViolation:
            raise CommandFailed(f"NAME {args.name!r}: a tenant with this name exists") from None
    emit(args, {"id": tenant_id, "name": args.name}) if args.json else print(tenant_id)
    return 0


@run_async
async def cmd_tenants_update(args: argparse.Namespace) -> int:
    from worker.rules import tenants
    from worker.store import tenants as tenant_store

    limits = _tenant_limits(args)
    if not limits:
        raise UsageError("nothing to change: give at least one limit or --allow-networks")
    async with connect(args) as conn:
        try:
            tenants.check(args.name, limits)
            await tenant_store.update(conn, args.name, limits)
        except tenants.InvalidTenant as exc:
            raise UsageError(str(exc)) from None
        except psycopg.errors.NoDataFound:
            raise CommandFailed(f"NAME {args.name!r}: no tenant with this name") from None
    print(f"tenant {args.name} updated")
    return 0


@run_async
async def cmd_tenants_list(args: argparse.Namespace) -> int:
    from worker.store import tenants as tenant_store

    async with connect(args) as conn:
        rows = await tenant_store.listing(conn)
    emit(args, rows, ["id", "name", "rate_limit_per_second", "max_in_flight", "max_endpoints", "max_queued",
                       "endpoints", "waiting", "in_flight", "dead_letters", "allow_networks"])
    return 0


@run_async
async def cmd_tenants_show(args: argparse.Namespace) -> int:
    from worker.store import tenants as tenant_store

    async with connect(args) as conn:
        row = await tenant_store.named(conn, args.name)
    if row is None:
        raise CommandFailed(f"NAME {args.name!r}: no tenant with this name")
    emit(args, row)
    return 0



def register(cli: Commands) -> None:
    tenant_commands = cli.group("tenants", "tenants: the teams or customers this deployment serves",
                                "Tenants, their fleet-wide limits (`none` clears a limit) and the private "
                                "networks their endpoints may reach.")

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
        sub.add_argument("--allow-networks", type=_networks, default=_UNSET, metavar="CIDRS",
                         help="private networks its endpoints may reach besides public destinations, "
                              "separated by commas (e.g. 10.1.0.0/16), replacing those granted before; "
                              "none: public destinations only. security.allow_networks is the "
                              "operator's and reaches the default tenant's endpoints only")

    tenant_add = cli.command(tenant_commands, "add", cmd_tenants_add, "add a tenant; prints its id")
    tenant_add.add_argument("name", metavar="NAME")
    tenant_limit_options(tenant_add)
    tenant_add.add_argument("--json", action="store_true", help="print JSON")
    tenant_update = cli.command(tenant_commands, "update", cmd_tenants_update,
                                "change a tenant's limits or granted networks")
    tenant_update.add_argument("name", metavar="NAME")
    tenant_limit_options(tenant_update)
    tenant_list = cli.command(tenant_commands, "list", cmd_tenants_list,
                              "list tenants, their limits and rows")
    tenant_list.add_argument("--json", action="store_true", help="print JSON")
    tenant_show = cli.command(tenant_commands, "show", cmd_tenants_show, "one tenant, its limits and rows")
    tenant_show.add_argument("name", metavar="NAME")
    tenant_show.add_argument("--json", action="store_true", help="print JSON")
