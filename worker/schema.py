"""The schema's migrations: the numbered SQL files shipped with the package, applied once each."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg

# Any constant works; it only has to be the same for every migrating process.
MIGRATION_LOCK_KEY = 0x5745_4248_4F4F_4B53 & 0x7FFF_FFFF_FFFF_FFFF  # "WEBHOOKS"
# The schema versions this code works with. Migrations are additive, so a worker keeps working (and
# stays ready) while a newer release migrates ahead of it; a breaking migration raises the minimum.
# 35: this release's worker claims only while it holds its liveness lock (035_worker_liveness).
# README's /ready line states this range; tests/unit/test_supported_schema.py keeps the two equal.
MIN_SUPPORTED_VERSION = 35
MAX_SUPPORTED_VERSION = 199
_FILENAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def sql_directory() -> Path:
    """The migrations: inside the installed package, or the checkout's top-level sql/."""
    packaged = Path(str(resources.files("worker"))) / "sql"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "sql"


def load_migrations(directory: Path | None = None) -> list[Migration]:
    directory = directory or sql_directory()
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILENAME.match(path.name)
        if match is None:
            raise RuntimeError(f"{path}: migration files are named NNN_name.sql")
        migrations.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"{directory}: two migrations share a number")
    return migrations


def latest_version() -> int:
    return max(m.version for m in load_migrations())


# From this version on, nothing in the schema is executable by PUBLIC (022_roles).
ROLES_VERSION = 22


def migrate(conninfo: str, up_to: int | None = None) -> list[Migration]:
    """Apply every migration not yet recorded (up to a version, for upgrade tests); returns those
    applied. Safe to run concurrently."""
    migrations = [m for m in load_migrations() if up_to is None or m.version <= up_to]
    applied: list[Migration] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # A session-level advisory lock serialises concurrent migrators for the whole run.
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            conn.execute("CREATE SCHEMA IF NOT EXISTS webhooks")
            conn.execute(
                """CREATE TABLE IF NOT EXISTS webhooks.schema_migrations (
                       version    integer     PRIMARY KEY,
                       name       text        NOT NULL,
                       checksum   text        NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = {
                row[0]: row[1]
                for row in conn.execute("SELECT version, checksum FROM webhooks.schema_migrations")
            }
            for migration in migrations:
                if migration.version in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO webhooks.schema_migrations (version, name, checksum)"
                        " VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                applied.append(migration)
            if max(m.version for m in migrations) >= ROLES_VERSION:
                # PostgreSQL grants EXECUTE to PUBLIC on every new function; close what any
                # migration created, so only the grants of 022_roles and later apply.
                conn.execute("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC")
            conn.execute("SELECT webhooks.ensure_log_partitions()")
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied


def current_version(conn: psycopg.Connection) -> int | None:
    row = conn.execute(
        "SELECT CASE WHEN to_regclass('webhooks.schema_migrations') IS NOT NULL"
        " THEN (SELECT max(version) FROM webhooks.schema_migrations) END"
    ).fetchone()
    return None if row is None else row[0]
