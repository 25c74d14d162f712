"""Plain-text tables for people: what the CLI and the demo print, and how a list names an endpoint (the
console's too)."""

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


def endpoint_label(name: str | None, endpoint_id: int | None, deleted_at: Any = None) -> str:
    """An endpoint as a list names it: its name; a deleted one's with its id and "deleted", so that its
    rows are never taken for those of the endpoint that has the name now."""
    if deleted_at is None:
        return cell(name)
    return f"{cell(name)} (id {cell(endpoint_id)}, deleted)"


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns padded to their widest value, two spaces apart, no trailing blanks."""
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
