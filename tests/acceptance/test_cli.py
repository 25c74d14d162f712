"""The `webhook-worker` command as a user runs it."""

import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT, TEST_KEYS, query
from worker.cli import main
from worker.encryption import KEYS_ENV

COMMANDS = [[], ["run"], ["migrate"], ["endpoints"], ["endpoints", "add"], ["endpoints", "list"],
            ["endpoints", "enable"], ["endpoints", "disable"], ["endpoints", "circuit"],
            ["endpoints", "show"], ["endpoints", "update"], ["endpoints", "rotate-secret"], ["enqueue"],
            ["status"], ["deliveries", "show"], ["dlq", "list"], ["replay"], ["config", "show"],
            ["config", "set"], ["purge"], ["keys"], ["keys", "generate"], ["keys", "status"],
            ["keys", "rotate"], ["demo"], ["api"], ["tokens"], ["tokens", "create"], ["tokens", "list"],
            ["tokens", "revoke"], ["operations"], ["operations", "list"], ["operations", "cancel"],
            ["endpoints", "test"], ["event-types"], ["event-types", "list"], ["event-types", "set"],
            ["event-types", "deprecate"], ["event-types", "unmatched"], ["triggers"], ["triggers", "add"],
            ["triggers", "list"], ["triggers", "show"], ["triggers", "disable"], ["triggers", "enable"],
            ["triggers", "drop"], ["triggers", "backfill"], ["triggers", "invoke"]]


def cli(*args, env=None, cwd=ROOT, timeout=120, executable=(sys.executable, "-m", "worker"), stdin=None):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("WEBHOOK_WORKER_") and k != "DATABASE_URL"}
    return subprocess.run([*executable, *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**clean, KEYS_ENV: TEST_KEYS, **(env or {})}, cwd=cwd, check=False)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_every_command_has_help(command, capsys):
    # in-process: argparse alone answers --help; the process as a user starts it is checked below
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: webhook-worker")


def test_help_from_the_installed_command():
    result = cli("--help")
    assert result.returncode == 0, result.stderr
    assert "usage: webhook-worker" in result.stdout and "endpoints" in result.stdout


@pytest.mark.parametrize("group", ["endpoints", "deliveries", "dlq", "config", "keys", "tokens",
                                   "operations", "triggers"])
def test_a_command_group_given_alone_prints_its_help_and_runs_nothing(group):
    result = cli(group, env={"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert result.returncode == 2
    assert f"usage: webhook-worker {group}" in result.stdout and "commands:" in result.stdout
    assert result.stderr == ""  # no worker started, no database tried


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("database:\n  url: postgresql://x/y\nworker:\n  concurency: 5\n", "worker.concurency: unknown key"),
        ("database:\n  url: postgresql://x/y\nworker:\n  concurrency: many\n",
         "worker.concurrency: Input should be a valid integer"),
        ("worker:\n  concurrency: 5\n", "database.url: missing"),
        ("database:\n  url: postgresql://x/y\ndelivery:\n  timeout_seconds: 60\n  lease_seconds: 30\n",
         "delivery: lease_seconds (30) must be at least timeout_seconds (60) + 5"),
    ],
    ids=["unknown key", "wrong type", "missing database url", "lease not longer than timeout"],
)
def test_a_bad_config_exits_non_zero_with_one_line_and_no_traceback(tmp_path, config, expected):
    path = tmp_path / "config.yaml"
    path.write_text(config)
    result = cli("--config", str(path))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(900)  # a build and an install, each with its own 300 s hang guard
def test_migrate_works_from_a_wheel_installed_outside_the_checkout(tmp_path, fresh_db):
    dist = tmp_path / "dist"
    # --no-build-isolation: the build backend comes from the dev install, nothing is fetched
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--no-index", "-q", "-w", str(dist), str(ROOT)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    [wheel] = dist.glob("webhook_worker-*.whl")
    shipped = zipfile.ZipFile(wheel).namelist()
    assert {"worker/sql/migrations/001_baseline.sql", "worker/sql/functions/claim.sql"} <= set(shipped)
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                                str(site), str(wheel)], capture_output=True, text=True, timeout=300,
                               check=False)
    assert installed.returncode == 0, installed.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(site), "DATABASE_URL": fresh_db(False)}

    where = cli("-c", "import worker.schema as s; print(s.sql_directory())", env=env, cwd=elsewhere,
                executable=(sys.executable,))
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr
    result = cli(env=env, cwd=elsewhere, executable=(str(site / "bin" / "webhook-worker"), "migrate"))
    assert result.returncode == 0, result.stderr
    assert "applied migrations/001_baseline.sql" in result.stdout
    assert "applied functions/claim.sql" in result.stdout
    assert query(env["DATABASE_URL"], "SELECT count(*) > 0 FROM webhooks.schema_migrations") == [(True,)]


def test_three_concurrent_migrations_record_each_migration_once(fresh_db):
    url = fresh_db(False)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cli("migrate", env={"DATABASE_URL": url})))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    applied = sorted(int(r.stdout.split("(")[1].split()[0]) for r in results)
    migrations = len(list((ROOT / "sql" / "migrations").glob("*.sql")))
    definitions = len(list((ROOT / "sql" / "functions").glob("*.sql")))
    assert applied == [0, 0, migrations + definitions]
    assert query(url, "SELECT count(*), count(DISTINCT version) FROM webhooks.schema_migrations") == [
        (migrations, migrations)]


def test_endpoints_add_and_list(db):
    env = {"DATABASE_URL": db}
    added = cli("endpoints", "add", "--name", "ops-slack", "--url",
                "https://hooks.example.test/services/T000/B000/SECRETPATH", "--event-type", "alert.created",
                "--header", "X-Team: ops", env=env)
    assert added.returncode == 0, added.stderr
    assert "endpoint 1 created" in added.stdout and "whsec_" in added.stdout
    listed = cli("endpoints", "list", env=env)
    assert listed.returncode == 0
    assert "ops-slack" in listed.stdout and "https://hooks.example.test" in listed.stdout
    assert "SECRETPATH" not in listed.stdout

    duplicate = cli("endpoints", "add", "--name", "ops-slack", "--url", "https://x.test/", env=env)
    assert duplicate.returncode == 1 and "exists" in duplicate.stderr  # refused by what exists
    reserved = cli("endpoints", "add", "--name", "b", "--url", "https://x.test/", "--header",
                   "webhook-id: forged", env=env)
    assert reserved.returncode == 2 and "cannot be overridden" in reserved.stderr
    bad_url = cli("endpoints", "add", "--name", "c", "--url", "ftp://x.test/", env=env)
    assert bad_url.returncode == 2 and "--url" in bad_url.stderr


def test_an_unreachable_database_is_one_clear_line(tmp_path):
    result = cli("migrate", env={"DATABASE_URL": "postgresql://nobody:hunter2@127.0.0.1:1/none"})
    assert result.returncode == 1
    assert "database unreachable" in result.stderr and "hunter2" not in result.stderr
    assert "Traceback" not in result.stderr


def test_the_demo_delivers_its_sample_alerts(fresh_db):
    result = cli("demo", env={"DATABASE_URL": fresh_db(False)}, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 of 5 alerts delivered" in result.stdout
    assert "signature verified" in result.stdout
