"""Waiting out a failing database: which errors are the database's, capped backoff, one-line reports."""

from __future__ import annotations

import psycopg
from psycopg_pool import PoolTimeout

DATABASE_ERRORS = (psycopg.Error, PoolTimeout, OSError)
# Errors that a retry can cure: the connection, not the statement, failed.
TRANSIENT_ERRORS = (psycopg.OperationalError, PoolTimeout, OSError)
MAX_BACKOFF_SECONDS = 5.0


class Backoff:
    """Capped exponential waits between retries of a failing database call."""

    def __init__(self, first: float = 0.1, cap: float = MAX_BACKOFF_SECONDS) -> None:
        self._first, self._cap, self._next = first, cap, first

    def next(self) -> float:
        current, self._next = self._next, min(self._next * 2, self._cap)
        return current

    def reset(self) -> None:
        self._next = self._first


def brief(exc: BaseException) -> str:
    """One line about a database error. psycopg messages never include the password."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
