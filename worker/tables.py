"""Plain-text tables for people: what the CLI and the demo print."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cell(value: Any) -> str:
    """A value as a table shows it: '-' for none, a list joined by commas."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns padded to their widest value, two spaces apart, no trailing blanks."""
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
