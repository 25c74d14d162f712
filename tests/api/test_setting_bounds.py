"""Settings that cannot be honoured are refused, naming the key and the reason, wherever they are set
(`config set`, PATCH /v1/config) or stored; the bounds the API's settings model states and the CHECK
constraints of webhooks.delivery_config say the same (read from pg_catalog)."""

from __future__ import annotations

import re

import pytest

from tests.acceptance.test_cli import cli
from tests.support import query
from worker import schema
from worker.api.settings import ConfigPatch
from worker.store import settings as setting_store

INTEGER_MAX = 2**31 - 1
OPERATORS = {">=": "minimum", "<=": "maximum", ">": "exclusiveMinimum", "<": "exclusiveMaximum"}
COMPARISON = re.compile(r"\((?P<left>[a-z_]+) (?P<op>>=|<=|>|<) "
                        r"(?P<right>\(\d+\)::[a-z ]+|'[^']*'::interval|[\d.]+)\)")
# Where the two differ on purpose, and why.
DIFFERENT = {
    # reals are stored rounded to six decimals (api.settings.REAL_DIGITS): the model asks for at least that
    ("circuit_failure_ratio", "minimum"): (1e-6, None),
    ("circuit_failure_ratio", "exclusiveMinimum"): (None, 0.0),
    ("circuit_probe_success_ratio", "minimum"): (1e-6, None),
    ("circuit_probe_success_ratio", "exclusiveMinimum"): (None, 0.0),
}


def value(db: str, text: str) -> float:
    """A bound as pg_get_constraintdef writes it: 100, (0)::double precision, '1 day'::interval (in
    seconds, as the API takes an interval)."""
    if text.endswith("::interval"):
        [(seconds,)] = query(db, "SELECT extract(epoch FROM %s::interval)::float8",
                             (text.removesuffix("::interval").strip("'"),))
        return float(seconds)
    return float(text.split("::")[0].strip("()"))


def sql_bounds(db: str) -> dict[str, dict[str, float]]:
    """Each setting's bounds in the CHECKs on webhooks.delivery_config, plus the integer type's."""
    found: dict[str, dict[str, float]] = {}
    for (definition,) in query(db, "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE contype = 'c'"
                                   " AND conrelid = 'webhooks.delivery_config'::regclass"):
        if "*" in definition:
            continue  # a rule between settings (lease_outlasts_timeout), not a bound
        for match in COMPARISON.finditer(definition):
            found.setdefault(match["left"], {})[OPERATORS[match["op"]]] = value(db, match["right"])
    for (column,) in query(db, "SELECT attname FROM pg_attribute"
                               " WHERE attrelid = 'webhooks.delivery_config'::regclass"
                               " AND atttypid = 'integer'::regtype"):
        found.setdefault(column, {}).setdefault("maximum", INTEGER_MAX)
    return found


def model_bounds(key: str) -> dict[str, float]:
    schema_of = ConfigPatch.model_json_schema()["properties"][key]
    names = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    bounds: dict[str, float] = {}
    for given in schema_of.get("anyOf", [schema_of]):
        if given.get("type") in ("number", "integer"):
            bounds |= {name: float(given[name]) for name in names if name in given}
    if schema_of.get("anyOf") and any(g.get("type") == "string" for g in schema_of["anyOf"]) \
            and bounds.get("minimum") == 0.0:
        del bounds["minimum"]  # an interval's seconds are never negative; the database does not say
    return bounds


def test_the_settings_models_bounds_are_the_check_constraints(db):
    in_sql = sql_bounds(db)
    for key in setting_store.SETTABLE:
        if key in ("retry_schedule", "notify_enabled"):
            continue
        expected, model = in_sql.get(key, {}), model_bounds(key)
        for name in set(expected) | set(model):
            if (key, name) in DIFFERENT:
                assert (model.get(name), expected.get(name)) == DIFFERENT[key, name], (key, name)
                continue
            assert model.get(name) == expected.get(name), (key, name, model, expected)
    # the bound with a reason, in one place on each side
    rule = setting_store.SETTING_MINIMUMS["log_retention"]
    assert in_sql["log_retention"] == {"minimum": rule.minimum.total_seconds()}
    assert query(db, "SELECT count(*) FROM pg_constraint WHERE conname = %s", (rule.constraint,)) == [(1,)]


@pytest.mark.parametrize("given", ["1 minute", "23 hours 59 minutes"])
def test_config_set_refuses_a_log_retention_below_a_day_naming_the_key_and_why(db, given):
    refused = cli("config", "set", "log_retention", given, env={"DATABASE_URL": db})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert ("webhook-worker: log_retention: must be at least 1 day: the audit log is kept in daily partitions"
            in refused.stderr), refused.stderr
    assert query(db, "SELECT log_retention::text FROM webhooks.delivery_config") == [("30 days",)]
    assert cli("config", "set", "log_retention", "1 day", env={"DATABASE_URL": db}).returncode == 0
    assert query(db, "SELECT log_retention::text FROM webhooks.delivery_config") == [("1 day",)]


def test_the_api_refuses_a_log_retention_below_a_day_naming_the_field_and_why(api, role_tokens, db):
    admin = role_tokens["admin"]
    for given in ("1 minute", 60, 86399.5):
        refused = api.request("PATCH", "/v1/config", admin, {"log_retention": given})
        assert refused.status == 422, refused.body
        problem = refused.json
        assert "log_retention" in (problem.get("field"), *(e.get("field") for e in problem.get("errors", [])))
        assert "at least 1 day" in problem["detail"] and "daily partitions" in problem["detail"], problem
    assert query(db, "SELECT log_retention::text FROM webhooks.delivery_config") == [("30 days",)]
    assert api.request("PATCH", "/v1/config", admin, {"log_retention": 86400}).status == 200


def test_a_database_holding_a_log_retention_below_a_day_gets_one_day_when_migrated(db):
    # the database as the release before the bound left it: the constraint not there yet, a minute set
    query(db, "ALTER TABLE webhooks.delivery_config DROP CONSTRAINT log_retention_at_least_a_day")
    query(db, "UPDATE webhooks.delivery_config SET log_retention = interval '1 minute'")
    query(db, "DELETE FROM webhooks.schema_migrations WHERE name = 'log_retention_bound'")
    notices: list[str] = []
    schema.migrate(db, on_notice=notices.append)
    assert query(db, "SELECT log_retention::text FROM webhooks.delivery_config") == [("1 day",)]
    assert notices == ["log_retention was 00:01:00 and is now 1 day: the audit log is dropped a whole day "
                       "at a time"]
