"""docs/reference/sql.md is what pg_catalog says after migrate: every function, view and table of
the schema, with who may use it."""

from __future__ import annotations

from scripts import gen_reference
from tests.support import ROOT

PAGE = ROOT / "docs" / "reference" / "sql.md"


def test_the_sql_page_is_what_the_catalog_renders(db: str):
    expected = gen_reference.rendered(dsn=db)[gen_reference.SQL_PAGE]
    assert PAGE.read_text(encoding="utf-8") == expected, (
        "docs/reference/sql.md is stale: run python -m scripts.gen_reference")


def test_the_sql_page_names_the_functions_producers_and_workers_call(db: str):
    text = PAGE.read_text(encoding="utf-8")
    for name in ("acquire", "finish", "enqueue", "publish", "replay", "delivery_history", "api_publish"):
        assert f"| `webhooks.{name}(" in text, name
    assert "| `webhooks.alert_delivery_queue` | producer: SELECT (" in text  # column grants, named
