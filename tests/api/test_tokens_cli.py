"""`webhook-worker tokens create|list|revoke` as an operator runs them."""

from __future__ import annotations

import json

from tests.acceptance.test_cli import cli
from tests.api.server import ApiServer, api_config
from tests.support import query


def test_create_prints_the_token_alone_on_its_last_line_and_it_works(db):
    result = cli(
        "tokens",
        "create",
        "--name",
        "ci",
        "--role",
        "producer",
        "--expires-in",
        "30",
        env={"DATABASE_URL": db},
    )
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert token.startswith("whk_") and "\n" not in token and " " not in token  # alone on stdout
    assert "shown once" in result.stderr
    server = ApiServer(api_config(db)).start()
    try:
        answer = server.get("/v1/token", token)
        assert answer.status == 200 and answer.json == {"name": "ci", "role": "producer"}
    finally:
        server.stop()
    [(role, expires)] = query(
        db, "SELECT role, expires_at > now() + interval '29 days' FROM webhooks.api_tokens WHERE name = 'ci'"
    )
    assert role == "producer" and expires


def test_create_json_list_and_revoke(db):
    env = {"DATABASE_URL": db}
    created = cli("tokens", "create", "--name", "oncall", "--role", "reader", "--json", env=env)
    assert created.returncode == 0, created.stderr
    token = json.loads(created.stdout)["token"]
    listed = cli("tokens", "list", "--json", env=env)
    assert listed.returncode == 0 and token not in listed.stdout
    [row] = json.loads(listed.stdout)
    assert (row["name"], row["role"], row["state"]) == ("oncall", "reader", "active")
    assert cli("tokens", "revoke", "oncall", env=env).returncode == 0
    [row] = json.loads(cli("tokens", "list", "--json", env=env).stdout)
    assert row["state"] == "revoked"
    again = cli("tokens", "revoke", "oncall", env=env)
    assert again.returncode == 1 and "no active token" in again.stderr


def test_create_refuses_bad_input_naming_the_option(db):
    env = {"DATABASE_URL": db}
    role = cli("tokens", "create", "--name", "x", "--role", "root", env=env)
    assert role.returncode == 2 and "--role" in role.stderr
    days = cli("tokens", "create", "--name", "x", "--role", "reader", "--expires-in", "-1", env=env)
    assert days.returncode == 2 and "--expires-in" in days.stderr
    name = cli("tokens", "create", "--name", " ", "--role", "reader", env=env)
    assert name.returncode == 2 and "--name: must not be empty" in name.stderr
    assert cli("tokens", "create", "--name", "dup", "--role", "reader", env=env).returncode == 0
    dup = cli("tokens", "create", "--name", "dup", "--role", "admin", env=env)
    assert dup.returncode == 1 and "exists" in dup.stderr
    assert query(db, "SELECT count(*) FROM webhooks.api_tokens")[0][0] == 1


def test_a_tenant_admin_token_is_created_with_its_tenant_and_administers_that_tenant_only(db):
    env = {"DATABASE_URL": db}
    assert cli("tenants", "add", "acme", env=env).returncode == 0
    unscoped = cli("tokens", "create", "--name", "x", "--role", "tenant_admin", env=env)
    assert unscoped.returncode == 2
    assert "--tenant: a tenant_admin token administers one tenant" in unscoped.stderr
    created = cli("tokens", "create", "--name", "acme-admin", "--role", "tenant_admin", "--tenant", "acme",
                  env=env)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    server = ApiServer(api_config(db)).start()
    try:
        assert server.get("/v1/token", token).json == {"name": "acme-admin", "role": "tenant_admin"}
        made = server.post("/v1/endpoints", token, {"name": "acme-hook", "url": "https://example.com/acme"})
        assert made.status == 201 and made.json["tenant"] == "acme", made.body
        assert server.get("/v1/tenants", token).status == 403
    finally:
        server.stop()
    [row] = json.loads(cli("tokens", "list", "--json", env=env).stdout)
    assert (row["role"], row["tenant"]) == ("tenant_admin", "acme")
