"""The API with the console mounted, and a cookie-keeping HTTP client for the console's pages."""

from __future__ import annotations

import http.client
import re
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlencode

from tests.api.server import Answer, ApiServer
from tests.support import TEST_KEYRING
from worker.api.app import build_state, create_app, create_metrics_app
from worker.api.serving import Listeners
from worker.console import create_console_app


class ConsoleServer(ApiServer):
    """ApiServer with the console at /console/, as `webhook-worker api` serves it."""

    async def _start(self) -> None:
        state = build_state(self.config)
        state.keyring = TEST_KEYRING
        await state.db.open()
        self.state = state
        self._listeners = Listeners(self.config.api, create_app(state, create_console_app),
                                    create_metrics_app(state))
        await self._listeners.start()
        self.port, self.metrics_port = self._listeners.port, self._listeners.metrics_port


class Browserless:
    """A person's browser reduced to what the tests check: cookies kept, redirects not followed."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.cookies: dict[str, str] = {}
        self.set_cookie_headers: list[str] = []

    def request(self, method: str, path: str, form: dict[str, Any] | list[tuple[str, Any]] | None = None,
                headers: dict[str, str] | None = None) -> Answer:
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode(form).encode()
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            raw_headers = response.getheaders()
            answer = Answer(response.status, {k.lower(): v for k, v in raw_headers}, response.read())
        finally:
            conn.close()
        self.set_cookie_headers = [v for k, v in raw_headers if k.lower() == "set-cookie"]
        for header in self.set_cookie_headers:
            for name, morsel in SimpleCookie(header).items():
                if morsel["max-age"] == "0" or not morsel.value:
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return answer

    def get(self, path: str, **kwargs: Any) -> Answer:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, form: Any = None, **kwargs: Any) -> Answer:
        return self.request("POST", path, form=form, **kwargs)

    def login(self, token: str, headers: dict[str, str] | None = None) -> Answer:
        page = self.get("/console/login", headers=headers)
        return self.post("/console/login", {"csrf": hidden(page, "csrf"), "token": token}, headers=headers)

    def csrf(self, path: str = "/console/") -> str:
        return hidden(self.get(path), "csrf")


def hidden(answer: Answer, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', answer.body.decode())
    assert found, f"no hidden field {name} in the page"
    return found.group(1)
