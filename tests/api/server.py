"""The API served on 127.0.0.1 from a thread of the test process, and a plain HTTP client for it."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support import (
    HANG_SECONDS,
    LOOPBACK,
    ROOT,
    TEST_KEYRING,
    TEST_KEYS,
    api_dsn,
    eventually,
    proc_cpu,
    stored,
)
from worker.api.app import ApiState, build_state, create_app, create_metrics_app
from worker.api.serving import GUARD, ConnectionGuard, Listeners
from worker.config import Config
from worker.encryption import KEYS_ENV
from worker.rules import tokens
from worker.store import tokens as token_store


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def api_config(dsn: str, as_owner: bool = False, **api: Any) -> Config:
    """The API's configuration over the database `dsn` (the owner's): it logs in as the API's own
    login unless as_owner, as docs/security.md deploys it."""
    return Config.model_validate(
        {
            "database": {"url": dsn if as_owner else api_dsn(dsn), "pool_max_size": 4},
            "api": {"host": "127.0.0.1", "port": 0, "metrics_port": 0, **api},
            "security": {"allow_networks": LOOPBACK},
        }
    )


class ApiServer:
    """`create_app` on real sockets (api.port and api.metrics_port, both picked free), served as
    `webhook-worker api` serves it."""

    def __init__(self, config: Config, console: Any = None) -> None:
        self.config = config
        self.console = console
        self.state: ApiState | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._listeners: Listeners | None = None
        self.guard: ConnectionGuard | None = None  # the connections it counts, for tests to wait on
        self.port = 0
        self.metrics_port = 0
        # every /v1 answer received, for the contract check at the end of each test
        self.answers: list[tuple[str, str, Answer]] = []

    def start(self) -> ApiServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        state = build_state(self.config)
        state.keyring = TEST_KEYRING
        await state.db.open()
        self.state = state
        app = create_app(state, self.console)
        self.guard = app[GUARD]
        self._listeners = Listeners(self.config.api, app, create_metrics_app(state))
        await self._listeners.start()
        self.port, self.metrics_port = self._listeners.port, self._listeners.metrics_port

    def stop(self) -> None:
        if self._listeners is not None:
            asyncio.run_coroutine_threadsafe(self._listeners.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def request(
        self,
        method: str,
        path: str,
        token: str | None = None,
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=data, headers=sent)
            response = conn.getresponse()
            headers_received = {k.lower(): v for k, v in response.getheaders()}
            answer = Answer(response.status, headers_received, response.read())
        finally:
            conn.close()
        if path.startswith("/v1/"):
            self.answers.append((method, path, answer))
        return answer

    def contract_problems(self) -> list[str]:
        from tests.api.contract import problems

        found = []
        for method, path, answer in self.answers:
            body = answer.json if answer.body else None
            found += problems(method, path, answer.status, answer.headers.get("content-type", ""), body)
        return found

    def metrics(self) -> str:
        """The metrics page, from api.metrics_port."""
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200, response.status
            return response.read().decode()
        finally:
            conn.close()

    def get(self, path: str, token: str | None = None, **kwargs: Any) -> Answer:
        return self.request("GET", path, token, **kwargs)

    def post(self, path: str, token: str | None = None, body: Any = None, **kwargs: Any) -> Answer:
        return self.request("POST", path, token, body, **kwargs)


def make_token(dsn: str, role: str, name: str | None = None, expires_at: Any = None,
               tenant: str | None = None) -> str:
    """A token of `role`; a tenant_admin token is the default tenant's unless told."""
    if role == "tenant_admin" and tenant is None:
        tenant = "default"
    return stored(dsn, token_store.create, name or f"{role}-{tokens.generate_token()[-8:]}", role, expires_at,
                  tenant)


class ApiProcess:
    """`python -m worker api --config FILE` as a subprocess, as it runs in production."""

    def __init__(self, dsn: str, workdir: Path, open_files: int | None = None, as_owner: bool = False,
                 **api: Any) -> None:
        config = {
            "database": {"url": dsn if as_owner else api_dsn(dsn)},
            "api": {"host": "127.0.0.1", "port": 0, "metrics_port": 0, **api},
            "logging": {"level": "info", "format": "json"},
            "security": {"allow_networks": LOOPBACK},
        }
        self.config_path = workdir / "api.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "api.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOK_WORKER_")}
        env.pop("DATABASE_URL", None)
        env[KEYS_ENV] = TEST_KEYS
        command = [sys.executable, "-m", "worker", "api", "--config", str(self.config_path)]
        if open_files is not None:
            # the process's open-file limit, soft and hard, set before it starts (as `ulimit -n` would)
            command[1:3] = ["-c", "import resource, runpy, sys; "
                            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({open_files}, {open_files})); "
                            "sys.argv[0] = 'webhook-worker'; runpy.run_module('worker', run_name='__main__')"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
            )
        # a start-up: it fails only when the process has stopped using CPU and writing its log
        self.port, self.metrics_port = eventually(self._ports, timeout=300, progress=self._activity,
                                                  message="api listening")
        self.client = ApiServer.__new__(ApiServer)
        self.client.port = self.port
        self.client.metrics_port = self.metrics_port
        self.client.answers = []

    def _ports(self) -> tuple[int, int] | None:
        for line in self.log_path.read_text().splitlines():
            if '"api listening"' in line:
                listening = json.loads(line)
                return int(listening["port"]), int(listening["metrics_port"])
        if self.process.poll() is not None:
            raise AssertionError(f"api exited: {self.log_path.read_text()}")
        return None

    def _activity(self) -> tuple[float, int]:
        return proc_cpu(self.process.pid), self.log_path.stat().st_size

    def stop(self, timeout: float = HANG_SECONDS) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
