"""The schema: numbered migrations applied once each, then the current definitions of the functions."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg

# Any constant works; it only has to be the same for every migrating process.
MIGRATION_LOCK_KEY = 0x5745_4248_4F4F_4B53 & 0x7FFF_FFFF_FFFF_FFFF  # "WEBHOOKS"
# The schema versions this code works with. Migrations are additive, so a worker keeps working (and
# stays ready) while a newer release migrates ahead of it; a breaking migration raises the minimum.
# 4: the worker sends digests, and acquire() returns each row's digest (004_coalescing).
# README's /ready line states this range; tests/unit/test_supported_schema.py keeps the two equal.
MIN_SUPPORTED_VERSION = 4
MAX_SUPPORTED_VERSION = 199
_MIGRATION_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_DEFINITIONS_NAME = re.compile(r"^[a-z0-9_]+\.sql$")
# The numbered layout before the baseline ended at 035_worker_liveness; a database it migrated that
# far has exactly the baseline's tables. Nothing of that layout was released, so no other version of
# it is recognised.
OLD_LAYOUT_VERSION = 35
OLD_LAYOUT_LAST_NAME = "worker_liveness"
# Constraints the old layout added NOT VALID (finished rows were exempt when they were added, and the
# checks themselves exempt finished rows); the baseline has them validated.
_OLD_LAYOUT_UNVALIDATED = ("event_type_printable", "idempotency_key_printable", "traceparent_w3c_format")
_ROLES = ("PUBLIC, webhooks_worker, webhooks_producer, webhooks_reader, webhooks_admin,"
          " webhooks_tenant_admin, webhooks_authenticator")


# The one server encoding the schema works in. Payloads are JSON, sent as UTF-8; in a SQL_ASCII
# database PostgreSQL hands text back as undecoded bytes, and every claim failed (`migrate` used to
# succeed there, and then no delivery was ever made).
REQUIRED_ENCODING = "UTF8"


def encoding_problem(encoding: str | None) -> str | None:
    """What is wrong with a database's encoding for webhook-worker, and how to make a right one; None
    for UTF8."""
    if encoding == REQUIRED_ENCODING:
        return None
    return (f"the database's encoding is {encoding or 'unknown'}, and webhook-worker needs UTF8 (payloads "
            "are JSON, sent as UTF-8). Create a UTF-8 database and use that one: CREATE DATABASE webhooks "
            "ENCODING 'UTF8' LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8' TEMPLATE template0 (or `createdb "
            "--encoding=UTF8 --locale=C.UTF-8 --template=template0 webhooks`)")


class MigrationError(RuntimeError):
    """The database and the migrations disagree in a way `migrate` must not paper over."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def filename(self) -> str:
        return f"{self.version:03d}_{self.name}.sql"

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class Definitions:
    """One file of sql/functions/: the current definition of some functions, views and triggers."""

    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def sql_directory() -> Path:
    """sql/: inside the installed package, or the checkout's top level."""
    packaged = Path(str(resources.files("worker"))) / "sql"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "sql"


def load_migrations(directory: Path | None = None) -> list[Migration]:
    directory = (directory or sql_directory()) / "migrations"
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if match is None:
            raise MigrationError(f"{path}: migration files are named NNN_name.sql")
        migrations.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"{directory}: two migrations share a number")
    return migrations


def load_definitions(directory: Path | None = None) -> list[Definitions]:
    """The files of sql/functions/, in the order they are applied (by name)."""
    directory = (directory or sql_directory()) / "functions"
    found = []
    for path in sorted(directory.glob("*.sql")):
        if _DEFINITIONS_NAME.match(path.name) is None:
            raise MigrationError(f"{path}: definition files are named area.sql")
        found.append(Definitions(path.name, path.read_text(encoding="utf-8")))
    return found


def latest_version() -> int:
    return max(m.version for m in load_migrations())


def migrate(conninfo: str, on_notice: Callable[[str], None] | None = None) -> list[str]:
    """Apply every migration not yet recorded, then the definition files if any changed; returns the
    files applied. Safe to run concurrently. `on_notice` hears what a migration says to the operator
    (its RAISE NOTICE lines: a renamed endpoint, say)."""
    migrations = load_migrations()
    definitions = load_definitions()
    applied: list[str] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        problem = encoding_problem(conn.info.parameter_status("server_encoding"))
        if problem is not None:
            raise MigrationError(problem)
        # A session-level advisory lock serialises concurrent migrators for the whole run.
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            _create_bookkeeping(conn)
            _adopt_old_layout(conn, migrations[0])
            done: dict[int, str] = dict(
                conn.execute("SELECT version, checksum FROM webhooks.schema_migrations").fetchall())
            _check_applied(migrations, done)
            for migration in migrations:
                if migration.version in done:
                    continue
                with conn.transaction(), _notices_to(conn, on_notice):
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO webhooks.schema_migrations (version, name, checksum)"
                        " VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                applied.append(f"migrations/{migration.filename}")
            # A newer release migrated this database: its definitions are the current ones, and
            # this release's (older) files must not replace them.
            newer_release = max(done, default=0) > migrations[-1].version
            if not newer_release and _definitions_changed(conn, definitions):
                with conn.transaction():
                    _apply_definitions(conn, definitions)
                applied.extend(f"functions/{d.name}" for d in definitions)
            # PostgreSQL grants EXECUTE to PUBLIC on every new function, wherever it came from:
            # nothing in the schema is callable by everyone.
            conn.execute("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC")
            conn.execute("SELECT webhooks.ensure_log_partitions()")
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied


@contextmanager
def _notices_to(conn: psycopg.Connection, on_notice: Callable[[str], None] | None) -> Iterator[None]:
    """While a migration runs: its RAISE NOTICE lines go to `on_notice` (the bookkeeping's own
    'already exists, skipping' notices do not)."""
    if on_notice is None:
        yield
        return
    tell = on_notice

    def handler(diag: psycopg.errors.Diagnostic) -> None:
        if diag.severity_nonlocalized == "NOTICE" and diag.message_primary:
            tell(diag.message_primary)

    conn.add_notice_handler(handler)
    try:
        yield
    finally:
        conn.remove_notice_handler(handler)


def _create_bookkeeping(conn: psycopg.Connection) -> None:
    conn.execute("CREATE SCHEMA IF NOT EXISTS webhooks")
    conn.execute(
        """CREATE TABLE IF NOT EXISTS webhooks.schema_migrations (
               version    integer     PRIMARY KEY,
               name       text        NOT NULL,
               checksum   text        NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())"""
    )
    conn.execute(
        """CREATE TABLE IF NOT EXISTS webhooks.schema_definitions (
               file       text        PRIMARY KEY,
               checksum   text        NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())"""
    )


def _adopt_old_layout(conn: psycopg.Connection, baseline: Migration) -> None:
    """A database the numbered layout before the baseline migrated: record the baseline as applied
    (its tables are already there, rows untouched) and leave its functions to the definition files,
    which replace them all and drop those no longer defined."""
    recorded: dict[int, str] = dict(
        conn.execute("SELECT version, name FROM webhooks.schema_migrations").fetchall())
    if not recorded or recorded.get(baseline.version) == baseline.name:
        return
    newest = max(recorded)
    if newest != OLD_LAYOUT_VERSION or recorded[newest] != OLD_LAYOUT_LAST_NAME:
        raise MigrationError(
            f"the database is at version {newest} ({recorded[newest]}) of the numbered layout before "
            f"{baseline.filename}; only version {OLD_LAYOUT_VERSION} ({OLD_LAYOUT_LAST_NAME}) of that "
            "layout can be moved onto the baseline")
    with conn.transaction():
        for constraint in _OLD_LAYOUT_UNVALIDATED:
            conn.execute(f"ALTER TABLE webhooks.alert_delivery_queue VALIDATE CONSTRAINT {constraint}")
        conn.execute("DELETE FROM webhooks.schema_migrations")
        conn.execute("INSERT INTO webhooks.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                     (baseline.version, baseline.name, baseline.checksum))
        conn.execute("DELETE FROM webhooks.schema_definitions")


def _check_applied(migrations: list[Migration], done: dict[int, str]) -> None:
    for migration in migrations:
        if migration.version in done and done[migration.version] != migration.checksum:
            raise MigrationError(
                f"sql/migrations/{migration.filename} changed after it was applied to this database "
                "(its checksum differs from the one recorded in webhooks.schema_migrations): a "
                "migration runs once, so change the schema in a new numbered migration instead")


def _definitions_changed(conn: psycopg.Connection, definitions: list[Definitions]) -> bool:
    recorded: dict[str, str] = dict(
        conn.execute("SELECT file, checksum FROM webhooks.schema_definitions").fetchall())
    return recorded != {d.name: d.checksum for d in definitions}


# Written by this transaction itself (not by one of its savepoints): a catalog row's xmin is then
# the transaction's own id.
_WRITTEN_HERE = "{alias}.xmin::text::bigint = (pg_current_xact_id()::text::bigint & 4294967295)"
# Something other than a function of ours needs it: a CHECK constraint (valid_retry_schedule(), part
# of the tables), a trigger (ours, or an application's on observer_queue_alert()), a view.
_NEEDED = ("EXISTS (SELECT 1 FROM pg_depend d WHERE d.refclassid = 'pg_proc'::regclass"
           " AND d.refobjid = p.oid AND d.classid <> 'pg_proc'::regclass)")


def _apply_definitions(conn: psycopg.Connection, definitions: list[Definitions]) -> None:
    """In the caller's transaction: every function, view, trigger and grant of the schema as the
    files define them now, and nothing else."""
    # Functions nothing else needs are dropped and made again: a changed signature or result type
    # needs nothing more than the edit, and no setting survives that the files do not state. The
    # others are replaced in place; those no file defines any more are dropped below.
    droppable = [row[0] for row in conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        f" WHERE p.pronamespace = 'webhooks'::regnamespace AND NOT {_NEEDED}").fetchall()]
    if droppable:
        conn.execute(f"DROP FUNCTION {', '.join(droppable)}")
    # Privileges: only what the files grant (the owner's own are untouched). In a savepoint, so
    # that the catalog rows it rewrites do not look written by the files below.
    with conn.transaction():
        for kind in ("TABLES", "SEQUENCES", "FUNCTIONS"):
            conn.execute(f"REVOKE ALL ON ALL {kind} IN SCHEMA webhooks FROM {_ROLES}")
        conn.execute(f"REVOKE ALL ON SCHEMA webhooks FROM {_ROLES}")
    # Bodies refer to objects of later files; each is checked when first called, as pg_dump does.
    conn.execute("SET LOCAL check_function_bodies = off")
    for definition in definitions:
        try:
            conn.execute(definition.sql.encode())
        except psycopg.Error as error:
            raise MigrationError(f"sql/functions/{definition.name}: {error}") from error
    # Views and triggers are replaced in place (an application's view over ours keeps working, and
    # the queue is never without its triggers, nor locked against readers); what no file defined is
    # what this transaction did not write.
    for (statement,) in conn.execute(
            "SELECT format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass) FROM pg_trigger t"
            " JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE c.relnamespace = 'webhooks'::regnamespace AND NOT t.tgisinternal"
            f"   AND NOT {_WRITTEN_HERE.format(alias='t')}").fetchall():
        conn.execute(statement)
    for (view,) in conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_rewrite r ON r.ev_class = c.oid"
            " WHERE c.relnamespace = 'webhooks'::regnamespace AND c.relkind = 'v'"
            f"   AND NOT {_WRITTEN_HERE.format(alias='r')}").fetchall():
        conn.execute(f"DROP VIEW {view}")
    for (function,) in conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p"
            f" WHERE p.pronamespace = 'webhooks'::regnamespace AND NOT {_WRITTEN_HERE.format(alias='p')}"
            f"   AND NOT {_NEEDED}").fetchall():
        conn.execute(f"DROP FUNCTION {function}")
    # PostgreSQL grants EXECUTE to PUBLIC on every new function: revoked before this commits.
    conn.execute("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC")
    conn.execute("DELETE FROM webhooks.schema_definitions")
    for definition in definitions:
        conn.execute("INSERT INTO webhooks.schema_definitions (file, checksum) VALUES (%s, %s)",
                     (definition.name, definition.checksum))


def role_advice(conninfo: str) -> list[str]:
    """What to change about the role that migrated, once it has: CREATEROLE is needed only while a
    migration creates the group roles (on PostgreSQL 15 a role with it can grant itself
    pg_execute_server_program and run programs as the server's OS user), and a superuser should
    not own what runs SECURITY DEFINER."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_user, quote_ident(current_user), rolsuper, rolcreaterole FROM pg_roles"
            " WHERE rolname = current_user").fetchone()
    if row is None:
        return []
    name, ident, superuser, createrole = row
    if superuser:
        return [f"advice: migrated as {name}, a superuser: the functions it made run SECURITY DEFINER with "
                "a superuser's rights; let an ordinary role own the schema (docs/security.md, "
                "\"Database roles\")"]
    if createrole:
        return [f"advice: {name} has CREATEROLE, which only creating the group roles needs (they exist "
                "now), and with which a role can grant itself pg_execute_server_program: drop it with "
                f"ALTER ROLE {ident} NOCREATEROLE; (as {name} itself on PostgreSQL 15, or as a superuser)"]
    return []


def current_version(conn: psycopg.Connection) -> int | None:
    row = conn.execute(
        "SELECT CASE WHEN to_regclass('webhooks.schema_migrations') IS NOT NULL"
        " THEN (SELECT max(version) FROM webhooks.schema_migrations) END"
    ).fetchone()
    return None if row is None else row[0]
