"""How a bulk operation keeps to its rate: rows per step and the pause after each. No I/O."""

from __future__ import annotations

import math

# Rows a second a bulk operation may be given: below one row in 1000 s its pauses overflow, and
# nobody means it; sql/functions/triggers.sql checks the same bounds for a backfill started in SQL.
RATE_MIN = 0.001
RATE_MAX = 100_000


def rate_problem(rate: float) -> str | None:
    """What is wrong with a rate given to a bulk operation, or None."""
    if not (RATE_MIN <= rate <= RATE_MAX):  # NaN fails both comparisons
        return f"rows a second, from {RATE_MIN:g} to {RATE_MAX:g}"
    return None


def step_plan(step_rows: int, rate: float | None) -> tuple[int, float]:
    """Rows per step and the pause after each: whole steps spaced out to keep to `rate` rows a second
    (at least one row a step), as the CLI's `replay --all --rate` does. The API's runner and
    `triggers backfill` step operations by it."""
    if rate is None or rate_problem(rate) is not None:
        # (an operation stored by hand with an unusable rate goes as fast as its steps go, rather
        # than stop every operation of the process that steps it)
        return step_rows, 0.0
    rows = max(1, min(step_rows, math.floor(rate)))
    return rows, rows / rate
