"""UTF-8 only: `migrate` and the worker refuse a database whose encoding is not UTF-8, naming the
encoding and how to create a UTF-8 database (a real SQL_ASCII database, made for each test)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.acceptance.test_cli import cli
from tests.support import HANG_SECONDS, add_endpoint, eventually, query
from worker import schema

HOW = "CREATE DATABASE webhooks ENCODING 'UTF8' LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8' TEMPLATE template0"


@pytest.fixture
def sql_ascii_db(pg_server: str) -> Iterator[str]:
    name = f"ascii_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"
                     " TEMPLATE template0")
    yield make_conninfo(**{**conninfo_to_dict(pg_server), "dbname": name})
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_migrate_refuses_a_sql_ascii_database_and_says_how_to_make_a_utf8_one(sql_ascii_db):
    with pytest.raises(schema.MigrationError) as refused:
        schema.migrate(sql_ascii_db)
    assert "the database's encoding is SQL_ASCII, and webhook-worker needs UTF8" in str(refused.value)
    assert HOW in str(refused.value)
    assert query(sql_ascii_db, "SELECT to_regnamespace('webhooks')") == [(None,)]  # nothing made
    ran = cli("migrate", env={"DATABASE_URL": sql_ascii_db})
    assert ran.returncode == 1 and "Traceback" not in ran.stderr
    assert "webhook-worker: migrate: the database's encoding is SQL_ASCII" in ran.stderr and HOW in ran.stderr


def test_the_worker_refuses_a_sql_ascii_database_a_release_before_migrated(sql_ascii_db, spawn, monkeypatch):
    # As the release before left such a database: migrated, an endpoint and a row queued; the
    # worker then claimed and failed every row ("lease expired"), delivering nothing.
    monkeypatch.setattr(schema, "encoding_problem", lambda encoding: None)
    schema.migrate(sql_ascii_db)
    monkeypatch.undo()
    endpoint = add_endpoint(sql_ascii_db, "http://127.0.0.1:9/x")
    query(sql_ascii_db, "SELECT webhooks.enqueue(%s, 'alert.created', '{\"disk\": 91}')", (endpoint,))
    worker = spawn(sql_ascii_db)
    eventually(lambda: worker.process.poll() is not None, timeout=HANG_SECONDS, message="the worker exits")
    assert worker.process.returncode == 2
    said = worker.log_path.read_text()
    assert "config error: database.url: the database's encoding is SQL_ASCII" in said and HOW in said
    assert "Traceback" not in said
    # nothing claimed (text comes back as bytes from a SQL_ASCII database: why it is refused)
    assert query(sql_ascii_db, "SELECT status, attempts FROM webhooks.alert_delivery_queue") == [
        (b"pending", 0)]


def test_a_utf8_database_migrates_and_is_served(db):
    assert query(db, "SHOW server_encoding") == [("UTF8",)]
    assert schema.encoding_problem("UTF8") is None
    assert schema.migrate(db) == []  # already migrated: nothing to do, nothing refused
