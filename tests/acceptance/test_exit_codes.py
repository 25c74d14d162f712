"""One exit-status rule for every command: 0 done, 1 understood but not done, 2 a wrong command line."""

import argparse

import pytest

from tests.support import TEST_KEYS
from worker.cli import EXIT_FAILURE, EXIT_USAGE, build_parser, main
from worker.encryption import KEYS_ENV, generate_key

UNREACHABLE = "postgresql://nobody:hunter2@127.0.0.1:1/none"


def leaf_commands() -> list[tuple[str, ...]]:
    """Every command the parser knows, as the words that name it."""
    found = []

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not groups:
            found.append(words)
        for group in groups:
            for name, sub in group.choices.items():
                walk(sub, (*words, name))

    walk(build_parser(), ())
    return found


# For each command, arguments that are well formed and name something that does not exist (1), or
# None with the reason the command names nothing that could be missing.
NAMES_NOTHING = {
    ("run",): "runs the worker",
    ("migrate",): "names nothing",
    ("endpoints", "list"): "names nothing",
    ("status",): "names nothing",
    ("config", "show"): "names nothing",
    ("keys", "generate"): "names nothing",
    ("keys", "status"): "names nothing",
    ("keys", "rotate"): "names nothing",
    ("demo",): "names nothing",
    ("api",): "serves the API",
    ("tokens", "list"): "names nothing",
    ("tenants", "list"): "names nothing",
    ("operations", "list"): "names nothing",
    ("event-types", "list"): "names nothing",
    ("event-types", "unmatched"): "names nothing",
    ("triggers", "list"): "names nothing",
}
MISSING = {
    ("endpoints", "add"): ["--name", "taken", "--url", "https://hooks.example.test/x"],  # name taken
    ("endpoints", "enable"): ["nosuch"],
    ("endpoints", "disable"): ["nosuch"],
    ("endpoints", "circuit"): ["nosuch", "reset"],
    ("endpoints", "show"): ["nosuch"],
    ("endpoints", "update"): ["nosuch", "--burst", "2"],
    ("endpoints", "rotate-secret"): ["nosuch"],
    ("endpoints", "delete"): ["nosuch"],
    ("enqueue",): ["--endpoint", "nosuch"],
    ("deliveries", "show"): ["99999"],
    ("dlq", "list"): ["--endpoint", "nosuch"],
    ("replay",): ["99999"],
    ("config", "set"): None,  # its KEY is checked against a fixed list: a usage error (below)
    ("purge",): ["--endpoint", "nosuch"],
    ("tokens", "create"): ["--name", "taken", "--role", "reader"],  # name taken
    ("tokens", "revoke"): ["nosuch"],
    ("tokens", "portal-link"): ["--tenant", "nosuch"],
    ("tenants", "add"): ["default"],  # the default tenant exists
    ("tenants", "show"): ["nosuch"],
    ("tenants", "update"): ["nosuch", "--max-queued", "10"],
    ("operations", "cancel"): ["99999"],
    ("endpoints", "test"): ["nosuch"],
    ("event-types", "deprecate"): ["no.such.type"],
    ("event-types", "set"): None,  # adds the type when it is missing
    ("triggers", "add"): ["orders", "--table", "public.nosuch", "--on", "insert", "--event-type", "order.x"],
    ("triggers", "show"): ["nosuch"],
    ("triggers", "disable"): ["nosuch"],
    ("triggers", "enable"): ["nosuch"],
    ("triggers", "drop"): ["nosuch"],
    ("triggers", "backfill"): ["nosuch"],
    ("triggers", "invoke"): ["nosuch", "--key", "1"],
}
# Well-formed arguments that reach the database (for the unreachable-database case).
MINIMAL = {
    ("migrate",): [], ("endpoints", "list"): [], ("status",): [], ("config", "show"): [],
    ("keys", "status"): [], ("keys", "rotate"): [], ("config", "set"): ["max_attempts", "5"],
    ("tokens", "list"): [], ("tenants", "list"): [], ("operations", "list"): [],
    ("event-types", "list"): [], ("event-types", "unmatched"): [], ("event-types", "set"): ["order.paid"],
    ("triggers", "list"): [],
    **{command: args for command, args in MISSING.items() if args is not None},
}
# Commands that never reach the database with the arguments above, and why.
NO_DATABASE = {("run",): "waits for its database instead of failing",
               ("keys", "generate"): "needs no database",
               ("demo",): "starts its own PostgreSQL when DATABASE_URL is unset",
               ("api",): "waits for its database (not ready meanwhile) instead of failing"}


@pytest.fixture
def as_user(monkeypatch, capsys):
    """Run `webhook-worker ARGS` in this process: (exit status, stderr)."""
    for name in ("DATABASE_URL", KEYS_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(KEYS_ENV, TEST_KEYS)

    def run(*args: str, database: str | None = None) -> tuple[int, str]:
        if database:
            monkeypatch.setenv("DATABASE_URL", database)
        capsys.readouterr()
        try:
            status = main(list(args))
        except SystemExit as exc:  # argparse
            status = int(exc.code or 0)
        return status, capsys.readouterr().err

    return run


def test_every_command_is_covered_by_these_tables():
    commands = set(leaf_commands())
    assert commands == set(NAMES_NOTHING) | set(MISSING)
    assert commands == set(MINIMAL) | set(NO_DATABASE)


@pytest.mark.parametrize("command", leaf_commands(), ids=" ".join)
def test_an_unknown_option_is_a_usage_error(as_user, command):
    status, stderr = as_user(*command, "--no-such-option")
    assert status == EXIT_USAGE, stderr
    assert "error:" in stderr and "Traceback" not in stderr


def test_what_a_command_names_not_existing_exits_1(as_user, db):
    as_user("endpoints", "add", "--name", "taken", "--url", "https://hooks.example.test/x", database=db)
    as_user("tokens", "create", "--name", "taken", "--role", "admin", database=db)
    failures = []
    for command, args in MISSING.items():
        if args is None:
            continue
        status, stderr = as_user(*command, *args, database=db)
        last_line = (stderr.splitlines() or [""])[-1]
        if status != EXIT_FAILURE or "Traceback" in stderr or not last_line.startswith("webhook-worker: "):
            failures.append((" ".join((*command, *args)), status, stderr))
    assert not failures


@pytest.mark.parametrize("command", sorted(MINIMAL), ids=" ".join)
def test_an_unreachable_database_exits_1(as_user, command):
    status, stderr = as_user(*command, *MINIMAL[command], database=UNREACHABLE)
    assert status == EXIT_FAILURE, stderr
    assert "database unreachable" in stderr and "hunter2" not in stderr


BAD_VALUES = [
    ["endpoints", "add", "--name", "x", "--url", "ftp://hooks.example.test/"],
    ["endpoints", "update", "nosuch", "--max-attempts", "0"],
    ["endpoints", "circuit", "nosuch", "close", "--until", "2030-01-01"],
    ["endpoints", "circuit", "taken", "open", "--until", "not a time"],
    ["endpoints", "show"],
    ["enqueue", "--endpoint", "taken", "--payload", "{not json"],
    ["deliveries", "show", "1", "--key", "k"],
    ["deliveries", "show", "not-a-number"],
    ["replay"],
    ["config", "set", "no_such_setting", "1"],
    ["config", "set", "max_attempts", "many"],
    ["tokens", "create", "--name", "x", "--role", "reader", "--expires-in", "0"],
    ["tokens", "create", "--name", "\n", "--role", "reader"],
    ["tokens", "create", "--name", "x", "--role", "tenant_admin"],
    ["tokens", "create", "--name", "x", "--role", "admin", "--tenant", "default"],
    ["endpoints", "test"],
    ["event-types", "set", "webhook.mine"],
    ["event-types", "set", "a*"],
    ["event-types", "set", "a.b", "--schema", "{not json"],
    ["event-types", "set", "a.b", "--schema", '{"type": 5}'],
    ["event-types", "set", "a.b", "--description", "x" * 2001],
    ["event-types", "deprecate", "webhook.test"],
    ["tokens", "portal-link", "--tenant", "default", "--expires-in", "2d"],
    ["tokens", "portal-link", "--tenant", "default", "--base-url", "console.test"],
]


def test_a_bad_value_is_a_usage_error_whatever_the_database_holds(as_user, db):
    as_user("endpoints", "add", "--name", "taken", "--url", "https://hooks.example.test/x", database=db)
    failures = []
    for args in BAD_VALUES:
        status, stderr = as_user(*args, database=db)
        if status != EXIT_USAGE or "Traceback" in stderr:
            failures.append((" ".join(args), status, stderr))
    assert not failures


def test_a_failed_lookup_is_1_everywhere_in_the_same_words(as_user, db):
    shown = as_user("endpoints", "show", "nosuch", database=db)
    enqueued = as_user("enqueue", "--endpoint", "nosuch", database=db)
    tested = as_user("endpoints", "test", "nosuch", database=db)
    expected = "webhook-worker: ENDPOINT 'nosuch': no endpoint with this name or id\n"
    assert shown == enqueued == tested == (EXIT_FAILURE, expected)
    assert as_user("deliveries", "show", "99999", database=db) == (
        EXIT_FAILURE, "webhook-worker: no such delivery\n")


def test_keys_that_cannot_open_the_stored_credentials_are_a_configuration_error(as_user, db, monkeypatch):
    as_user("endpoints", "add", "--name", "sealed", "--url", "https://hooks.example.test/x", database=db)
    monkeypatch.setenv(KEYS_ENV, generate_key())
    for command in (("keys", "status"), ("keys", "rotate")):
        status, stderr = as_user(*command, database=db)
        assert status == EXIT_USAGE, stderr  # as for a worker given them (tests/integration/test_security.py)
        assert "cannot be opened" in stderr or "do not include" in stderr
