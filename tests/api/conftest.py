"""Fixtures for the API tests: the API on 127.0.0.1 over a database of the test's own, and a token
per role."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.server import ApiServer, api_config, make_token


@pytest.fixture
def api(db: str) -> Iterator[ApiServer]:
    server = ApiServer(api_config(db)).start()
    yield server
    server.stop()
    # every answer a test received must be one the OpenAPI document describes
    problems = server.contract_problems()
    assert not problems, "answers the OpenAPI document does not describe:\n" + "\n".join(problems[:20])


@pytest.fixture
def role_tokens(db: str) -> dict[str, str]:
    """A token per role; the tenant_admin's is the default tenant's, where the tests' endpoints are."""
    return {role: make_token(db, role) for role in ("producer", "reader", "admin", "tenant_admin")}
