"""An outside fuzzer against the live API: schemathesis reads the served OpenAPI document and runs
every check it has against a real `webhook-worker api` process, for each role, with the real
failed-authentication limiter on (its probes without a token count against 127.0.0.1; valid tokens
are never refused by it). Zero failures; what the document cannot say is allowed below, with why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.server import ApiProcess, make_token
from tests.support import add_endpoint, enqueue, query

SEED = 20261127
FAILED_AUTH_PER_MINUTE = 100
# Cases per operation and role; with the coverage phase's deterministic cases the three runs stay
# within a minute or two on a busy 2-core machine. One worker: schemathesis' threads parse Python
# source at once (hypothesis describing its strategies), which CPython 3.11's ast module does not
# survive ("AST constructor recursion depth mismatch").
EXAMPLES = {"admin": 5, "reader": 2, "producer": 2, "tenant_admin": 2}
# A hang guard per role's run. The test's own guard is their sum: on a machine loaded several times
# over, the four runs took longer than the suite's default 300 s between them and nothing hung.
ROLE_RUN_SECONDS = 600
# Valid to the document and still refused with 422, because the answer depends on the database's
# state, which no schema can describe. Each entry: the operations, the extra status, and why.
ALLOWED = [
    # a name or id that names no endpoint (publish's `endpoint`, a filter's `endpoint`): 422 naming
    # the field. The document cannot list which endpoints exist.
    ("POST /v1/messages", "422", "endpoint names no endpoint"),
    ("GET /v1/deliveries", "422", "endpoint names no endpoint"),
    ("GET /v1/dead-letters", "422", "endpoint names no endpoint"),
    ("POST /v1/dead-letters/replay", "422", "filter.endpoint names no endpoint"),
    # likewise `tenant` on a list (or on a token) that names no tenant, or another tenant than a
    # scoped token's own
    ("GET /v1/endpoints", "422", "tenant names no tenant"),
    # the destination rules on `url` depend on the configuration (security.require_https, the
    # networks refused) and on what its host resolves to at the time: the document gives its form only
    # (and a name, as a tenant's below, must be printable: the pattern keeps out control characters;
    # Unicode's other unprintable classes, format or unassigned characters, have no pattern that the
    # tools reading JSON Schema agree on)
    ("POST /v1/endpoints", "422", "url refused by the destination rules, or a name not printable"),
    ("PATCH /v1/endpoints/{id}", "422", "url refused by the destination rules"),
    ("POST /v1/tenants", "422", "a name not printable, or allow_networks not addresses or CIDRs"),
    # a tenant's granted networks are addresses or CIDRs (worker.rules.destinations.granted_networks): no
    # pattern the tools agree on describes both families and their prefix lengths
    ("PATCH /v1/tenants/{id}", "422", "allow_networks not addresses or CIDRs"),
    # a signing secret is whsec_ and the base64 of 24 to 64 bytes (worker.rules.signing): its decoded
    # length has no pattern; the document describes it in words
    ("POST /v1/endpoints/{id}/rotate-secret", "422", "a secret that is not whsec_<base64 of 24-64 bytes>"),
    # rules over several settings (lease_outlasts_timeout: lease_seconds * 1000 >= timeout_ms + 5000)
    # and an interval's syntax are the database's to check; JSON Schema cannot compare two fields
    ("PATCH /v1/config", "422", "a rule over several settings, or an interval PostgreSQL cannot read"),
    # an event type's name (worker.rules.event_types.name_problem): not 'webhook.*' (the worker's own), no
    # '*', at most 256 bytes of UTF-8; and a schema must itself be a valid JSON Schema: neither a
    # prefix's absence nor a byte length nor "is a JSON Schema" has a pattern the tools agree on
    ("PUT /v1/event-types/{name}", "422", "a reserved or wildcard name, or a schema that is not one"),
    ("POST /v1/event-types/{name}/deprecate", "422", "a reserved (webhook.*) name"),
    # a token's tenant goes with its role (tenant_admin: required; admin: refused) and must exist
    ("POST /v1/tokens", "422", "a tenant missing, refused for the role, or naming no tenant"),
]


def config_file(path: Path) -> Path:
    lines = []
    for operation, status, _why in ALLOWED:
        method, route = operation.split(" ", 1)
        lines += [
            "[[operations]]",
            f'include-path = "{route}"',
            f'include-method = "{method}"',
            'checks.positive_data_acceptance.expected-statuses = '
            f'["2xx", "3xx", "401", "403", "404", "409", "429", "{status}"]',
            "",
        ]
    path.write_text("\n".join(lines))
    return path


@pytest.fixture
def world(db, receiver):
    """Rows for the ids schemathesis tries to find: endpoints, a dead letter, a delivered row."""
    endpoint = add_endpoint(db, receiver.url("/hook"), name="orders")
    add_endpoint(db, receiver.url("/spare"), name="spare")
    [dead, delivered] = enqueue(db, endpoint, count=2)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter', dead_lettered_at = now(),"
              " dead_letter_reason = 'http 400', failure_category = 'http_4xx' WHERE delivery_id = %s",
          (dead,))
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now()"
              " WHERE delivery_id = %s", (delivered,))
    return endpoint


@pytest.mark.timeout(len(EXAMPLES) * ROLE_RUN_SECONDS + 120)
def test_schemathesis_finds_no_failure_for_any_role(db, world, tmp_path):
    # The limiter is on. Its limit is raised from 20 to FAILED_AUTH_PER_MINUTE: each run sends one
    # invalid-token probe per operation (27) within seconds, and its ignored_auth check wants 401/403
    # for them, not the 429 the default limit would answer past 20 (a valid token is never refused).
    api = ApiProcess(db, tmp_path, failed_auth_per_minute=FAILED_AUTH_PER_MINUTE)
    config = config_file(tmp_path / "schemathesis.toml")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"}
    failures = []
    try:
        for role, examples in EXAMPLES.items():
            token = make_token(db, role)
            run = subprocess.run(
                [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
                 f"http://127.0.0.1:{api.port}/v1/openapi.json", "--checks", "all", "--seed", str(SEED),
                 "--max-examples", str(examples), "--workers", "1", "--no-shrink",
                 "--generation-database", "none", "--suppress-health-check", "all",
                 "--header", f"Authorization: Bearer {token}", "--request-timeout", "30"],
                capture_output=True, text=True, timeout=ROLE_RUN_SECONDS, env=env, cwd=tmp_path)
            report = tmp_path / f"schemathesis-{role}.txt"
            report.write_text(run.stdout + run.stderr)
            if run.returncode != 0:
                summary = run.stdout[run.stdout.find("FAILURES"):] if "FAILURES" in run.stdout else run.stdout
                failures.append(f"--- {role} (exit {run.returncode}, all of it in {report}) ---\n"
                                f"{summary[-15000:]}\n{run.stderr[-2000:]}")
        # ... and it was on: more failures from this address are refused
        statuses = [api.client.get("/v1/token", "whk_" + "x" * 43).status
                    for _ in range(FAILED_AUTH_PER_MINUTE + 1)]
        assert statuses[-1] == 429, statuses
    finally:
        assert api.stop() == 0
    assert not failures, "\n".join(failures)
