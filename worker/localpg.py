"""A throwaway local PostgreSQL cluster, for the demo and the test suite when no DATABASE_URL is set."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

# Durability is pointless for a cluster that is deleted afterwards; turning it off makes tests faster.
THROWAWAY_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}


def _find_binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise RuntimeError(f"{name} not found: install PostgreSQL server binaries or set DATABASE_URL")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalPostgres:
    """initdb + pg_ctl in a temporary directory; as root, the server runs as the `postgres` user."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.settings = {**THROWAWAY_SETTINGS, **(settings or {})}
        self.port = _free_port()
        self.base = Path(tempfile.mkdtemp(prefix="webhook-worker-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "postgres.log"
        self._user: str | None = None
        if os.geteuid() == 0:
            # initdb refuses to run as root.
            self._user = "postgres"
            account = pwd.getpwnam(self._user)
            os.chown(self.base, account.pw_uid, account.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            args, user=self._user, capture_output=True, text=True, cwd=self.base, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {result.stderr or result.stdout}")

    def start(self) -> str:
        if not self.data.exists():
            self._run(
                _find_binary("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                "-E", "UTF8", "--locale=C", "--no-sync",
            )
        options = " ".join(f"-c {key}={value}" for key, value in self.settings.items())
        self._run(
            _find_binary("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
            "-o", f"-p {self.port} -k {self.base} {options}", "start",
        )
        return self.url

    def restart(self, mode: str = "fast") -> None:
        """`pg_ctl restart -m MODE`: fast disconnects everyone cleanly, immediate is a crash."""
        self._run(
            _find_binary("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-m", mode, "-w", "-t", "60",
            "restart",
        )

    def halt(self, mode: str = "fast") -> None:
        """Stop the server but keep its data, so start() brings the same cluster back."""
        self._run(_find_binary("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def standby_of(self, primary: LocalPostgres, application_name: str) -> None:
        """Make this (unstarted) cluster a streaming standby of `primary`: a base backup, and
        standby.signal with primary_conninfo naming it `application_name` (what the primary's
        synchronous_standby_names names). start() then starts it in recovery."""
        self._run(
            _find_binary("pg_basebackup"), "-D", str(self.data), "-h", "127.0.0.1",
            "-p", str(primary.port), "-U", "postgres", "--wal-method=stream", "--checkpoint=fast",
            "--no-sync", "--write-recovery-conf",
        )
        conninfo = make_conninfo(host="127.0.0.1", port=str(primary.port), user="postgres",
                                 application_name=application_name)
        with open(self.data / "postgresql.auto.conf", "a") as conf:  # read after what -R wrote
            conf.write(f"primary_conninfo = '{conninfo}'\n")

    def promote(self) -> None:
        """`pg_ctl promote`, waiting until the standby accepts writes."""
        self._run(_find_binary("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run(
                [_find_binary("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                user=self._user, capture_output=True, check=False, cwd=self.base,
            )
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def role_dsn(dsn: str, login: str, password: str) -> str:
    """The same connection string, logging in as another role."""
    return make_conninfo(dsn, user=login, password=password)


def login_role(admin_dsn: str, login: str, groups: str | tuple[str, ...], password: str,
               inherit: bool = True) -> str:
    """Connect as a login role that is a member of `groups` (e.g. webhooks_worker), as production
    clients do: the role is created in the cluster if missing; returns its connection string.
    NOINHERIT (inherit=False): the login holds its groups' privileges only once it SETs a role."""
    create = sql.SQL(
        "DO $$ BEGIN"
        " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {name}) THEN"
        "   CREATE ROLE {role} LOGIN {inherit} PASSWORD {password};"
        " END IF;"
        # another process may create it at the same moment
        " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;"
        " END $$"
    ).format(name=sql.Literal(login), role=sql.Identifier(login), password=sql.Literal(password),
             inherit=sql.SQL("INHERIT" if inherit else "NOINHERIT"))
    names = (groups,) if isinstance(groups, str) else groups
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(create)
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.SQL(", ").join(map(sql.Identifier, names)),
                                                       sql.Identifier(login)))
    return role_dsn(admin_dsn, login, password)
