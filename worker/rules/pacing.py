"""How a bulk operation keeps to its rate: rows per step and the pause after each. No I/O."""

from __future__ import annotations

import math


def step_plan(step_rows: int, rate: float | None) -> tuple[int, float]:
    """Rows per step and the pause after each: whole steps spaced out to keep to `rate` rows a second
    (at least one row a step), as the CLI's `replay --all --rate` does. The API's runner and
    `triggers backfill` step operations by it."""
    if rate is None:
        return step_rows, 0.0
    rows = max(1, min(step_rows, math.floor(rate)))
    return rows, rows / rate
