"""Bulk operations (dead-letter replays, table-trigger backfills) stepped by every API process, resumable."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import psycopg

from worker.observability import get_logger
from worker.rules.pacing import step_plan
from worker.store import operations as operation_store
from worker.web.context import ApiState

# How often a process looks for running operations it has not heard of (started by another
# process, or left running by one that stopped).
SCAN_SECONDS = 1.0


async def _step(conn: psycopg.AsyncConnection[Any], operation_id: int, rows: int) -> tuple[Any, ...] | None:
    """One step: (status, processed), or None while another session steps it. An operation that
    cannot go on ends as failed, with why, so that the others still go on."""
    try:
        return await operation_store.step(conn, operation_id, rows)
    except (psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError) as exc:
        error = (exc.diag.message_primary or type(exc).__name__).splitlines()[0]
        await operation_store.fail(conn, operation_id, error)
        get_logger().warning("api operation failed", operation_id=operation_id, error=error)
        return ("failed", None)


async def run_operations(state: ApiState) -> None:
    """Step every running operation until it is done; runs for the life of the process."""
    log = get_logger()
    due: dict[int, float] = {}
    while not state.stopping.is_set():
        try:
            async with state.db.connection() as conn:
                running = await operation_store.running(conn)
                now = time.monotonic()
                for operation_id, rate in running:
                    if due.get(operation_id, 0.0) > now:
                        continue
                    rows, pause = step_plan(state.config.api.replay_step_rows, rate)
                    stepped = await _step(conn, operation_id, rows)
                    due[operation_id] = time.monotonic() + pause
                    if stepped is not None and stepped[0] != "running":
                        due.pop(operation_id, None)
                        log.info("api operation finished", operation_id=operation_id, processed=stepped[1])
                for operation_id in set(due) - {r[0] for r in running}:
                    del due[operation_id]
                busy = any(d <= time.monotonic() for d in due.values())
        except (psycopg.Error, TimeoutError) as exc:
            if state.stopping.is_set():
                return  # the process is stopping, not the database failing
            log.warning("api operations paused: database call failed", error=type(exc).__name__)
            busy = False
        if busy:
            await asyncio.sleep(0)
            continue
        if state.stopping.is_set():
            return
        wait = min([SCAN_SECONDS, *(max(0.0, d - time.monotonic()) for d in due.values())])
        state.operations_wakeup.clear()
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for was seen to swallow the
        # cancellation that stops this loop (state.stopping ends it whatever a cancellation met)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await state.operations_wakeup.wait()
