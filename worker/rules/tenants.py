"""Tenants as the operator manages them: their names, limits and granted networks checked before
worker.store.tenants stores them."""

from __future__ import annotations

from typing import Any

from worker.rules.destinations import granted_networks

# What a tenant may set, as webhooks.set_tenant_limits() names it, with its CLI option: its limits,
# and the private networks its endpoints may reach (worker.rules.destinations.tenant_destinations).
LIMIT_OPTIONS = {
    "rate_limit_per_second": "--rate-limit",
    "rate_limit_burst": "--burst",
    "max_in_flight": "--max-in-flight",
    "max_endpoints": "--max-endpoints",
    "max_queued": "--max-queued",
    "allow_networks": "--allow-networks",
}
MAX_NAME = 100
# The metrics' `tenant` label of the tenants past the label limit (worker.observability). No tenant may
# take this name (name_problem() and webhooks.register_tenant() refuse it), so it always means "the rest".
OTHER_TENANTS = "other"
# A request refused for the tenant's max_queued (SQLSTATE 53400 from the gate, webhooks.queue_deliveries()):
# constraint QUEUE_FULL when it may fit once the queue drains, which it does at the tenant's delivery
# rate (a few seconds is a fair first wait); QUOTA_TOO_SMALL when it needs more rows than max_queued
# itself and can never fit.
QUOTA_RETRY_AFTER_SECONDS = 5
QUEUE_FULL = "tenant_queue_full"
QUOTA_TOO_SMALL = "tenant_quota_too_small"
SUMMARY_COLUMNS = ("id", "name", "rate_limit_per_second", "rate_limit_burst", "max_in_flight",
                   "max_endpoints", "max_queued", "endpoints", "waiting", "in_flight", "dead_letters",
                   "created_at", "allow_networks")


def quota_retry_after(constraint: str | None) -> int | None:
    """The seconds a request refused for the tenant's max_queued should wait; None: it never fits."""
    return None if constraint == QUOTA_TOO_SMALL else QUOTA_RETRY_AFTER_SECONDS


class InvalidTenant(ValueError):
    """A tenant name or limit that cannot be stored; the message names the option."""


def name_problem(name: str) -> str | None:
    if name == OTHER_TENANTS:
        return f"{name!r} is reserved: it labels the tenants past the metrics label limit"
    if not 1 <= len(name) <= MAX_NAME:
        return f"must be 1 to {MAX_NAME} characters"
    if any(not c.isprintable() or c.isspace() for c in name):
        return "must be printable, without spaces"
    if name.isascii() and name.isdigit():
        return "must not be all digits (an all-digit tenant in a path always means an id)"
    return None


def limits_problem(limits: dict[str, Any]) -> str | None:
    """What is wrong with these limits (None: unset), naming the option; None if they can be stored."""
    for key, value in limits.items():
        option = LIMIT_OPTIONS[key]
        if value is None:
            continue
        if key == "allow_networks":
            try:
                granted_networks(value)
            except ValueError as exc:
                return f"{option}: {exc}"
        elif key == "rate_limit_per_second":
            if not value > 0:
                return f"{option}: must be above 0 requests per second, not {value:g}"
        elif key in ("max_endpoints", "max_queued"):
            if value < 0:
                return f"{option}: must be 0 or more, not {value}"
        elif value < 1:
            return f"{option}: must be 1 or more, not {value}"
    return None


def stored(limits: dict[str, Any]) -> dict[str, Any]:
    """The limits as webhooks.set_tenant_limits() stores them: each granted network as its network
    (10.1.2.3/16 is 10.1.0.0/16), none given as an empty list. Checked first (limits_problem)."""
    if "allow_networks" not in limits:
        return limits
    return {**limits, "allow_networks": granted_networks(limits["allow_networks"] or [])}


def check(name: str, limits: dict[str, Any]) -> None:
    """InvalidTenant naming the option, unless the name and the limits can be stored."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidTenant(f"NAME: {problem}")
    problem = limits_problem(limits)
    if problem is not None:
        raise InvalidTenant(problem)
