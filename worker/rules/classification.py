"""Pure delivery decisions: what an attempt's result means, and when to try again. No I/O."""

from __future__ import annotations

import email.utils
import enum
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# Retry-After beyond a day is more likely a misconfigured receiver than a plan; cap it.
MAX_RETRY_AFTER_SECONDS = 86_400.0
DEFAULT_DELAYS: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
# The same bounds as webhooks.valid_retry_schedule() in SQL.
MAX_DELAY_SECONDS = 604_800.0


class Category(enum.StrEnum):
    """Why an attempt failed, as recorded in the queue and the audit log."""

    TIMEOUT = "timeout"
    CONNECT = "connect"
    DNS = "dns"
    TLS = "tls"
    PROTOCOL = "protocol"  # the answer was not valid HTTP (or broke the status and header bounds)
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    REDIRECT = "redirect"
    RATE_LIMITED = "rate_limited"
    BLOCKED = "blocked"
    INTERNAL = "internal"
    EXPIRED = "expired"  # set in SQL when a row's expires_at passes before delivery
    DISABLED = "disabled"  # set in SQL when a disabled endpoint's row outlives its retry window
    ENDPOINT_DELETED = "endpoint_deleted"  # set in SQL when its endpoint is deleted with its waiting rows


CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)


def category_problem(value: str) -> str | None:
    """What is wrong with a failure category given as a filter, or None."""
    if value in CATEGORIES:
        return None
    return f"expected one of {', '.join(CATEGORIES)}"


class Outcome(enum.StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    DEFERRED = "deferred"  # the receiver asked us to wait: the attempt is given back
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True)
class AttemptResult:
    """What one HTTP attempt produced: a status, or a transport failure with its category."""

    status: int | None = None
    retry_after: str | None = None
    failure: Category | None = None
    error: str | None = None


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    category: Category | None = None
    retry_after_seconds: float | None = None
    reason: str | None = None
    disable_endpoint: bool = False


def classify(result: AttemptResult, now: datetime | None = None) -> Decision:
    """Map an attempt to delivered, retry, deferred or dead letter (docs/design.md, Classification)."""
    if result.failure is Category.BLOCKED:
        # A refused destination stays refused: retrying cannot help, and the receiver never saw it.
        return Decision(Outcome.DEAD_LETTER, Category.BLOCKED, reason=result.error or "destination refused")
    if result.status is None:
        return Decision(Outcome.RETRY, result.failure or Category.INTERNAL)
    status = result.status
    if 200 <= status < 300:
        return Decision(Outcome.DELIVERED)
    retry_after = parse_retry_after(result.retry_after, now)
    if status in (429, 503) and retry_after is not None:
        category = Category.RATE_LIMITED if status == 429 else Category.HTTP_5XX
        return Decision(Outcome.DEFERRED, category, retry_after_seconds=retry_after)
    if 300 <= status < 400:
        return Decision(Outcome.RETRY, Category.REDIRECT)
    if status == 429:
        return Decision(Outcome.RETRY, Category.RATE_LIMITED)
    if status in (408, 425):
        return Decision(Outcome.RETRY, Category.HTTP_4XX, retry_after_seconds=retry_after)
    if status >= 500:
        return Decision(Outcome.RETRY, Category.HTTP_5XX, retry_after_seconds=retry_after)
    if status == 410:
        return Decision(
            Outcome.DEAD_LETTER, Category.HTTP_4XX, reason="HTTP 410 Gone: endpoint disabled",
            disable_endpoint=True,
        )
    if 400 <= status < 500:
        return Decision(Outcome.DEAD_LETTER, Category.HTTP_4XX, reason=f"HTTP {status}")
    return Decision(Outcome.RETRY, Category.INTERNAL, reason=f"unexpected HTTP status {status}")


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as seconds from now (delta-seconds or an HTTP date), capped; None if absent or bad."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_SECONDS)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


@dataclass(frozen=True)
class RetrySchedule:
    """Either an explicit list of delays or exponential growth (base * multiplier**n, capped)."""

    delays: tuple[float, ...] = DEFAULT_DELAYS
    base: float | None = None
    multiplier: float = 2.0
    cap: float = 86_400.0
    jitter: float = 0.2

    @classmethod
    def from_json(cls, spec: Mapping[str, Any] | None, jitter: float) -> RetrySchedule:
        """Parse the schedule stored in delivery_config or on an endpoint."""
        if not spec:
            return cls(jitter=jitter)
        if "delays" in spec:
            delays = tuple(float(d) for d in spec["delays"])
            if not delays or any(not 0 <= d <= MAX_DELAY_SECONDS for d in delays):
                raise ValueError("retry schedule: delays must be a non-empty list of 0 to 604800 seconds")
            return cls(delays=delays, jitter=jitter)
        if "base" in spec:
            base = float(spec["base"])
            multiplier = float(spec.get("multiplier", 2.0))
            cap = float(spec.get("cap", 86_400.0))
            in_range = 0 <= base <= MAX_DELAY_SECONDS and 0 <= cap <= MAX_DELAY_SECONDS
            if not (in_range and 1 <= multiplier <= 100):
                raise ValueError("retry schedule: base and cap 0 to 604800 s, multiplier 1 to 100")
            return cls(delays=(), base=base, multiplier=multiplier, cap=cap, jitter=jitter)
        raise ValueError("retry schedule: expected {'delays': [...]} or {'base': ..., 'multiplier': ...}")

    def nominal_delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based), before jitter."""
        index = max(attempt, 1) - 1
        if self.base is not None:
            # min() before the power can overflow: past ~1000 steps any multiplier > 1 hits the cap
            return float(min(self.cap, self.base * self.multiplier ** min(index, 1000)))
        return self.delays[min(index, len(self.delays) - 1)]

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The nominal delay with ±jitter, so retries of many rows do not arrive in one wave."""
        nominal = self.nominal_delay(attempt)
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, nominal * (1.0 + spread))


def retry_delay(
    decision: Decision, attempt: int, schedule: RetrySchedule, rng: random.Random | None = None
) -> float:
    """When to try again: the receiver's Retry-After when it gave one and it is later, else the schedule."""
    scheduled = schedule.delay(attempt, rng)
    if decision.outcome is Outcome.DEFERRED and decision.retry_after_seconds is not None:
        return decision.retry_after_seconds
    if decision.retry_after_seconds is not None:
        return max(scheduled, decision.retry_after_seconds)
    return scheduled



@dataclass(frozen=True)
class RetryPolicy:
    """Finer control, from delivery_config.retry_policy with the endpoint's keys on top."""

    connect_timeout_seconds: float | None = None
    timeout_growth: float = 1.0
    timeout_cap_seconds: float | None = None
    category_min_delays: Mapping[str, float] | None = None

    @classmethod
    def from_json(cls, spec: Mapping[str, Any] | None) -> RetryPolicy:
        spec = spec or {}
        known = {"connect_timeout_ms", "timeout_growth", "timeout_cap_ms", "category_min_delays"}
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"retry policy: unknown key {sorted(unknown)[0]}")
        minimums = {str(k): float(v) for k, v in (spec.get("category_min_delays") or {}).items()}
        if any(v < 0 or v > MAX_DELAY_SECONDS for v in minimums.values()):
            raise ValueError("retry policy: category_min_delays are 0 to 604800 seconds")
        growth = float(spec.get("timeout_growth", 1.0))
        if not 1.0 <= growth <= 10.0:
            raise ValueError("retry policy: timeout_growth is 1 to 10")
        connect = spec.get("connect_timeout_ms")
        cap = spec.get("timeout_cap_ms")
        return cls(
            connect_timeout_seconds=None if connect is None else float(connect) / 1000.0,
            timeout_growth=growth,
            timeout_cap_seconds=None if cap is None else float(cap) / 1000.0,
            category_min_delays=minimums,
        )

    def timeout(self, base_seconds: float, attempt: int, ceiling_seconds: float) -> float:
        """The request timeout for this attempt: base * growth**(attempt-1), capped (and never past
        the ceiling the lease allows)."""
        grown = base_seconds * self.timeout_growth ** min(max(attempt, 1) - 1, 100)
        if self.timeout_cap_seconds is not None:
            grown = min(grown, max(self.timeout_cap_seconds, base_seconds))
        return min(grown, ceiling_seconds)

    def min_delay(self, category: Category | None, delay: float) -> float:
        """At least the category's minimum delay (e.g. 60 s after rate_limited, 5 s after dns)."""
        if category is None or not self.category_min_delays:
            return delay
        return max(delay, self.category_min_delays.get(category.value, 0.0))
