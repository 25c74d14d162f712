"""The endpoint service's bounds (worker/rules/endpoints.py, as the OpenAPI document publishes them) and the
CHECK constraints SQL keeps for producers writing to webhooks.endpoints directly say the same: the
constraints read from pg_catalog."""

import re

from tests.support import query
from worker.rules import endpoints as service

# model field -> (column, how many column units one field unit is)
COLUMNS = {
    "max_attempts": ("max_attempts", 1),
    "timeout_seconds": ("timeout_ms", 1000),
    "rate_limit_per_second": ("rate_limit_per_second", 1),
    "rate_limit_burst": ("rate_limit_burst", 1),
    "max_in_flight": ("max_in_flight", 1),
    "coalesce_max": ("coalesce_max", 1),
    "coalesce_window": ("coalesce_window", 1),
    "description": ("char_length(description)", 1),
}
# Where the two differ on purpose, and why.
DIFFERENT = {
    # 0 turns coalescing off (stored as NULL); 1 is refused by coalescing.settings_problem, which names
    # the option: a digest of one row is no digest
    ("coalesce_max", "minimum"): (0, 2),
}
INTEGER_MAX = 2**31 - 1
OPERATORS = {">=": "minimum", "<=": "maximum", ">": "exclusiveMinimum", "<": "exclusiveMaximum"}
COMPARISON = re.compile(
    r"\((?P<left>[a-z_]+(?:\([a-z_]+\))?) (?P<op>>=|<=|>|<) (?P<right>\(\d+\)::numeric|[^()]+?)\)")


def value(text: str) -> float:
    """A bound as pg_get_constraintdef writes it: 100, 0.5, '01:00:00'::interval (in seconds)."""
    text = text.strip()
    if text.endswith("::interval"):
        hours, minutes, seconds = text.removesuffix("::interval").strip("'").split(":")
        return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    return float(text.removesuffix("::numeric").strip("()"))


def sql_bounds(db: str) -> dict[str, dict[str, float]]:
    """Each left-hand side's bounds in the CHECKs on webhooks.endpoints, plus the integer type's."""
    found: dict[str, dict[str, float]] = {}
    for (definition,) in query(db, "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                                   " WHERE conrelid = 'webhooks.endpoints'::regclass AND contype = 'c'"):
        if " OR " in definition or "IS NULL" in definition:
            continue  # a rule between columns, not a bound
        for match in COMPARISON.finditer(definition):
            found.setdefault(match["left"], {})[OPERATORS[match["op"]]] = value(match["right"])
    for (column,) in query(db, "SELECT attname FROM pg_attribute"
                               " WHERE attrelid = 'webhooks.endpoints'::regclass"
                               " AND atttypid = 'integer'::regtype"):
        found.setdefault(column, {}).setdefault("maximum", INTEGER_MAX)
    return found


def model_bounds(field: str) -> dict[str, float]:
    schema = service.EndpointFields.model_json_schema()["properties"][field]
    [given] = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
    names = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    bounds = {name: float(given[name]) for name in names if name in given}
    if "maxLength" in given:
        bounds["maximum"] = float(given["maxLength"])
    return bounds


def test_the_models_bounds_are_the_check_constraints(db):
    in_sql = sql_bounds(db)
    for field, (column, factor) in COLUMNS.items():
        expected = {name: bound / factor for name, bound in in_sql.get(column, {}).items()}
        model = model_bounds(field)
        for name in set(expected) | set(model):
            if (field, name) in DIFFERENT:
                assert (model.get(name), expected.get(name)) == DIFFERENT[field, name], (field, name)
                continue
            assert model.get(name) == expected.get(name), (field, name, model, expected)


def test_the_body_formats_are_the_check_constraints(db):
    [(definition,)] = query(db, "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                                " WHERE conrelid = 'webhooks.endpoints'::regclass AND contype = 'c'"
                                " AND pg_get_constraintdef(oid) LIKE '%%body_format = ANY%%'"
                                " AND pg_get_constraintdef(oid) NOT LIKE '%%IS NULL%%'")
    assert set(re.findall(r"'([a-z]+)'::text", definition)) == set(service.BODY_FORMATS)
