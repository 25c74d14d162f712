"""Worker processes on this machine, as the benchmark and the tests start them: their keys, logins and
configuration, the endpoints they deliver to, and the waits on them.

The one copy of these helpers: tests/support.py re-exports them, so a change (an encryption key, the
network allow-list, how a worker is configured) is made once and the benchmark's workers are the
tests' workers. Nothing here imports the tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import yaml

from worker.encryption import KEYS_ENV, Keyring, generate_key
from worker.localpg import login_role
from worker.rules import signing
from worker.rules.redaction import display_url
from worker.store.endpoints import EndpointSpec, register_endpoint

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
# The run's encryption key: every endpoint registered here is sealed with it, every worker holds it.
KEYS = generate_key()
KEYRING = Keyring.parse(KEYS, KEYS_ENV)
# Receivers listen on loopback, which workers refuse unless it is allowed explicitly.
LOOPBACK = ["127.0.0.1/32", "::1/128"]
WORKER_LOGIN = "webhooks_test_worker"
LOGIN_PASSWORD = "test-only-password"


def login_as(dsn: str, login: str, group: str) -> str:
    """The DSN of a login role that is a member of `group` only (created in the cluster if missing)."""
    return login_role(dsn, login, group, LOGIN_PASSWORD)


def worker_dsn(dsn: str) -> str:
    return login_as(dsn, WORKER_LOGIN, "webhooks_worker")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Deadlines are for hangs, not for speed: a loaded machine (CI, a shared box) slows the suite and
# must not fail it. A wait on one event with nothing to watch gives up after HANG_SECONDS; a wait
# that can watch its progress fails once nothing has moved for STALL_SECONDS, under a cap sized
# from its work. What a test claims about time it measures itself, against the product's own timers.
HANG_SECONDS = 60.0
STALL_SECONDS = 30.0


def eventually(check: Callable[[], T], timeout: float = HANG_SECONDS, interval: float = 0.05,
               message: str = "condition", *, progress: Callable[[], object] | None = None,
               stall: float = STALL_SECONDS, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> T:
    """Return check()'s first truthy value. Fail once `timeout` has passed (a hang guard); with
    `progress`, fail as soon as its value has stayed the same for `stall` seconds while check()
    is still falsy: nothing moved, so nothing will. (clock and sleep: for testing this helper.)"""
    started = clock()
    seen, moved_at = (progress() if progress is not None else None), started
    while True:
        value = check()
        if value:
            return value
        now = clock()
        if progress is not None:
            latest = progress()
            if latest != seen:
                seen, moved_at = latest, now
            elif now - moved_at > stall:
                raise AssertionError(f"{message} not met: nothing moved for {stall} s (progress: {seen!r},"
                                     f" last value: {value!r}, {now - started:.1f} s in all)")
        if now - started > timeout:
            raise AssertionError(f"{message} not met within {timeout} s (last value: {value!r}"
                                 + (f", progress: {seen!r}" if progress is not None else "") + ")")
        sleep(interval)


def stored(dsn: str, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """A worker.store call (`call(conn, *args, **kwargs)`) from synchronous code, on an async connection
    of its own in autocommit, on an event loop of its own in a thread (so it may be called while
    another loop runs)."""

    async def run() -> T:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await call(conn, *args, **kwargs)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


def add_endpoint(dsn: str, url: str, name: str | None = None, **overrides: Any) -> int:
    """Register one endpoint through the Python API, sealed with KEYRING; overrides are
    EndpointSpec fields (plus `secret`)."""
    return stored(dsn, _register, url, name or f"ep-{time.monotonic_ns()}", **overrides)


def add_endpoints(dsn: str, urls: list[str], prefix: str = "ep", **overrides: Any) -> list[int]:
    """One endpoint per URL (named prefix-1, prefix-2, …), each with its own signing secret, on one
    connection; returns their ids in order."""

    async def register_all(conn: psycopg.AsyncConnection[Any]) -> list[int]:
        return [await _register(conn, url, f"{prefix}-{i + 1}", **dict(overrides))
                for i, url in enumerate(urls)]

    return stored(dsn, register_all)


async def _register(conn: psycopg.AsyncConnection[Any], url: str, name: str, **overrides: Any) -> int:
    return await register_endpoint(conn, EndpointSpec(
        name=name, url=url, url_display=display_url(url),
        signing_secrets=(overrides.pop("secret", None) or signing.generate_secret(),),
        **overrides,
    ), KEYRING)


def query(dsn: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []


# What the tests shorten so that they wait less; the benchmark keeps production's values.
TEST_TIMINGS: dict[str, dict[str, Any]] = {
    "worker": {"poll_interval_seconds": 0.1},
    "http": {"stats_interval_seconds": 0.2},
}


def worker_config(dsn: str, name: str, as_role: bool = True, timings: dict[str, dict[str, Any]] | None = None,
                  **sections: dict[str, Any]) -> dict[str, Any]:
    """The YAML of one worker: production defaults, except its id, probes on a free port of
    127.0.0.1, JSON logs and loopback allowed as a destination; then `timings` (the tests' short
    polls unless given) and `sections`. With as_role, it logs in as a member of webhooks_worker only,
    as in production."""
    config: dict[str, Any] = {
        "database": {"url": worker_dsn(dsn) if as_role else dsn},
        "worker": {"id": name},
        "logging": {"level": "info", "format": "json"},
        "http": {"host": "127.0.0.1", "port": 0},
        "security": {"allow_networks": LOOPBACK},
    }
    for overrides in (TEST_TIMINGS if timings is None else timings, sections):
        for section, values in overrides.items():
            config.setdefault(section, {}).update(values)
    return config


def worker_env(keys: str = KEYS) -> dict[str, str]:
    """This process's environment without any WEBHOOK_WORKER_* or DATABASE_URL, plus the keys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOK_WORKER_")}
    env.pop("DATABASE_URL", None)
    if keys:
        env[KEYS_ENV] = keys
    return env


class WorkerProcess:
    """`python -m worker --config FILE` as a subprocess, as it runs in production."""

    def __init__(self, dsn: str, workdir: Path, name: str, as_role: bool = True, keys: str = KEYS,
                 timings: dict[str, dict[str, Any]] | None = None, **sections: dict[str, Any]) -> None:
        """See worker_config for as_role, timings and sections."""
        config = worker_config(dsn, name, as_role, timings, **sections)
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"{name}.log"
        self.name = name
        self.expected_errors: set[str] = set()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "worker", "--config", str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT, env=worker_env(keys), cwd=ROOT,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                lines.append({"event": line})
        return lines

    def expect_errors(self, *events: str) -> None:
        """Error lines with these events are part of what the test checks, not a failure."""
        self.expected_errors.update(events)

    def unexpected_errors(self) -> list[dict[str, Any]]:
        """Lines at error level or above, or carrying a traceback, that the test did not expect."""
        return [line for line in self.log_lines()
                if (line.get("level") in ("error", "critical") or "exception" in line
                    or "Traceback" in str(line.get("event", "")))
                and line.get("event") not in self.expected_errors]

    def logged(self, event: str) -> bool:
        return any(line.get("event") == event for line in self.log_lines())

    @property
    def http_port(self) -> int | None:
        for line in self.log_lines():
            if line.get("event") == "probes and metrics listening":
                return int(line["port"])
        return None

    def get(self, path: str) -> tuple[int, str]:
        """GET a probe or /metrics of this worker: (status, body); (0, "") while it is not listening."""
        import urllib.error
        import urllib.request

        if self.http_port is None:
            return 0, ""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except urllib.error.URLError:
            return 0, ""

    def started(self) -> bool:
        """Whether it has logged "worker started" (a text search: cheap enough to poll)."""
        try:
            return '"worker started"' in self.log_path.read_text()
        except OSError:
            return False

    def cpu(self) -> float:
        """CPU seconds (user + system) it has used so far; 0 once it is gone."""
        return proc_cpu(self.pid)

    def activity(self) -> tuple[float, int]:
        """(CPU seconds, bytes logged): a progress measure for waits on what it is doing."""
        try:
            logged = self.log_path.stat().st_size
        except OSError:
            logged = 0
        return self.cpu(), logged

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self, timeout: float = HANG_SECONDS) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def stop_or_kill(self, timeout: float = 60.0) -> int:
        """SIGTERM; SIGKILL when it has not exited within the timeout. Returns the exit code."""
        try:
            return self.stop(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def wait_started(workers: list[WorkerProcess], timeout: float = 300.0, stall: float = STALL_SECONDS) -> None:
    """Wait until every worker has logged "worker started"; fail early when one exits, or when none
    of those still starting has used any CPU or written any log for `stall` seconds."""
    def started() -> bool:
        for w in workers:
            if w.process.poll() is not None and not w.started():
                raise RuntimeError(f"{w.name} exited with {w.process.returncode}; see {w.log_path}")
        return all(w.started() for w in workers)

    eventually(started, timeout=timeout, message=f"{', '.join(w.name for w in workers)} started",
               progress=lambda: [w.activity() for w in workers if not w.started()], stall=stall)
