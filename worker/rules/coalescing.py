"""Digests: which claimed rows go as one request, and the identity that request carries."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

# Bodies that can carry several alerts: raw has no shape for it, and PagerDuty groups by dedup_key.
COALESCING_FORMATS = ("slack", "mattermost", "envelope")
MAX_COALESCE = 1000  # as the endpoints_coalesce_max_range constraint
MAX_WINDOW_SECONDS = 3600  # as the endpoints_coalesce_window_range constraint
DIGEST_EVENT_TYPE = "webhook.batch"


class Member(Protocol):
    @property
    def delivery_id(self) -> int: ...
    @property
    def idempotency_key(self) -> str: ...
    @property
    def digest_id(self) -> int | None: ...


M = TypeVar("M", bound=Member)


def requests(rows: Sequence[M]) -> list[list[M]]:
    """The claimed rows as requests, in claim order: a row of its own, or a digest's members in
    delivery order (the claim returns them in any order)."""
    by_digest: dict[int, list[M]] = {}
    grouped: list[list[M]] = []
    for row in rows:
        if row.digest_id is None:
            grouped.append([row])
        elif row.digest_id in by_digest:
            by_digest[row.digest_id].append(row)
        else:
            by_digest[row.digest_id] = members = [row]
            grouped.append(members)
    for members in by_digest.values():
        members.sort(key=lambda member: member.delivery_id)
    return grouped


def digest_webhook_id(members: Sequence[Member]) -> str:
    """The webhook-id of a digest: derived from its members' idempotency keys, so the same group sent
    again carries the same id (a receiver deduplicates it), and a group some member left does not."""
    keys = sorted(member.idempotency_key for member in members)
    return "digest_" + hashlib.sha256("\n".join(keys).encode()).hexdigest()[:32]


def digest_label(digest_id: int) -> str:
    """How a digest is named to people: in headers, `deliveries show` and the logs."""
    return f"d-{digest_id}"


def settings_problem(
    coalesce_max: int | None, window_seconds: float | None, body_format: str | None
) -> str | None:
    """What is wrong with a coalescing policy, naming the option; None if it can be stored.
    `body_format` is the endpoint's format after the change (None: not known here)."""
    if coalesce_max is not None and not 2 <= coalesce_max <= MAX_COALESCE:
        return f"--coalesce-max: must be between 2 and {MAX_COALESCE} rows per request, not {coalesce_max}"
    if window_seconds is not None:
        if not 0 <= window_seconds <= MAX_WINDOW_SECONDS:
            return (f"--coalesce-window: must be between 0 and {MAX_WINDOW_SECONDS} seconds, "
                    f"not {window_seconds:g}")
        if coalesce_max is None:
            return "--coalesce-window: needs --coalesce-max (how many rows one request may carry)"
    if coalesce_max is not None and body_format is not None and body_format not in COALESCING_FORMATS:
        return (f"--coalesce-max: format {body_format} is never coalesced "
                f"(only {', '.join(COALESCING_FORMATS)} bodies can carry several alerts)")
    return None


def settings_changes(
    coalesce_max: int | None, window_seconds: float | None, body_format: str | None,
    stored_max: int | None = None,
) -> dict[str, Any]:
    """webhooks.update_endpoint's fields for `--coalesce-max` / `--coalesce-window` (0 turns
    coalescing off). `body_format` is the format after the change, `stored_max` the endpoint's
    current setting. Raises ValueError naming the option, before SQL sees a bad value."""
    if coalesce_max == 0:
        if window_seconds is not None:
            raise ValueError("--coalesce-window: not with --coalesce-max 0 (which turns coalescing off)")
        return {"coalesce_max": None, "coalesce_window": None}
    if coalesce_max is None and window_seconds is None:
        if stored_max is not None and body_format is not None and body_format not in COALESCING_FORMATS:
            raise ValueError(f"--format {body_format}: the endpoint coalesces, and {body_format} bodies "
                             "never are; turn coalescing off first (--coalesce-max 0)")
        return {}
    problem = settings_problem(coalesce_max if coalesce_max is not None else stored_max, window_seconds,
                             body_format)
    if problem is not None:
        raise ValueError(problem)
    changes: dict[str, Any] = {}
    if coalesce_max is not None:
        changes["coalesce_max"] = coalesce_max
    if window_seconds is not None:
        changes["coalesce_window"] = f"{window_seconds} seconds"
    return changes
