"""Fault tests get a PostgreSQL of their own when they restart, stop or start it late."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from worker import schema
from worker.localpg import LocalPostgres

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
