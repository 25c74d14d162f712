"""Fixtures: a real PostgreSQL (throwaway unless DATABASE_URL is set), a database per test, a
real receiver on 127.0.0.1, and worker processes that are always cleaned up."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.receiver import Receiver
from tests.support import WorkerProcess
from worker import schema
from worker.localpg import LocalPostgres

# One per run, so that two runs against the same DATABASE_URL server never drop each other's template.
TEMPLATE = f"webhooks_test_template_{uuid.uuid4().hex[:8]}"
# Tests that load the machine or race a receiver run one after another on one xdist worker (README's
# test command runs the suite with pytest-xdist, `--dist loadgroup`), beside the rest.
SERIAL_GROUP_PATHS = ("tests/faults/", "tests/integration/test_limits.py",
                      "tests/integration/test_wakeups.py", "tests/integration/test_transport.py",
                      "tests/acceptance/test_bench.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.relative_to(config.rootpath).as_posix()
        if path.startswith(SERIAL_GROUP_PATHS):
            item.add_marker(pytest.mark.xdist_group("serial"))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Connection string of a maintenance database on a server we may create databases on."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    with LocalPostgres() as local:
        yield local.url


def _with_dbname(url: str, dbname: str) -> str:
    params = conninfo_to_dict(url)
    params["dbname"] = dbname
    return make_conninfo(**params)


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> Iterator[str]:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    url = _with_dbname(pg_server, TEMPLATE)
    schema.migrate(url)
    yield url
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")


@pytest.fixture
def fresh_db(pg_server: str) -> Iterator[Callable[[bool], str]]:
    """Factory: a new database, migrated (copied from the template) or empty."""
    created: list[str] = []

    def make(migrated: bool = True) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {TEMPLATE}" if migrated else ""))
        created.append(name)
        return _with_dbname(pg_server, name)

    yield make
    with psycopg.connect(pg_server, autocommit=True) as conn:
        for name in created:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def db(template_db: str, fresh_db: Callable[[bool], str]) -> str:
    """A migrated database of this test's own."""
    return fresh_db(True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `webhook-worker` processes; any still running at the end are killed."""
    started: list[WorkerProcess] = []

    def start(dsn: str, name: str | None = None, **options: Any) -> WorkerProcess:
        process = WorkerProcess(dsn, tmp_path, name or f"worker-{len(started) + 1}", **options)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
    # A worker that logged an error or a traceback the test did not ask for fails it, whatever else
    # the test asserted: "the worker keeps going" must not hide a crash inside it.
    unexpected = {p.name: p.unexpected_errors() for p in started}
    unexpected = {name: lines for name, lines in unexpected.items() if lines}
    if unexpected:
        pytest.fail(f"workers logged errors the test did not expect: {unexpected}", pytrace=False)


# Durable commits here: a crash (-m immediate) must lose nothing that was acknowledged.
DURABLE = {"synchronous_commit": "on", "fsync": "on", "full_page_writes": "on"}


@pytest.fixture
def own_pg() -> Iterator[LocalPostgres]:
    """A migrated cluster of this test's own, which the test may stop, restart or crash."""
    local = LocalPostgres(DURABLE)
    local.start()
    schema.migrate(local.url)
    yield local
    local.stop()


@pytest.fixture
def unstarted_pg() -> Iterator[LocalPostgres]:
    """A cluster whose port is known but which is not running yet."""
    local = LocalPostgres(DURABLE)
    yield local
    local.stop()
