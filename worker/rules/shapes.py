"""Values read from PostgreSQL as JSON, for the CLI's --json and the API alike: numbers as numbers
(numeric arrives as Decimal), durations in seconds (interval arrives as timedelta), so what is read
can be sent back."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any


def json_default(value: Any) -> Any:
    """What json.dumps / orjson.dumps write for a value they do not know."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)
