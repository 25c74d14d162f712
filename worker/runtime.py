"""How a process runs: its event loop (worker.event_loop), ending its tasks, its open-files limit."""

from __future__ import annotations

import asyncio
import importlib.util
import resource
from collections.abc import Callable, Iterable
from typing import Any

# What `auto` means where uvloop is installed: adopted only if it gains >= 10% in the median of
# alternating end-to-end drains, which it did not (docs/performance.md).
AUTO_PREFERS_UVLOOP = False


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def chosen_loop(setting: str, uvloop_available: bool) -> str:
    """The loop to run: `asyncio` or `uvloop`. `uvloop` when it is not installed is an error that
    names the setting and the fix, never a silent fall-back."""
    if setting == "asyncio":
        return "asyncio"
    if setting == "uvloop":
        if not uvloop_available:
            raise ValueError(
                "worker.event_loop is 'uvloop' but uvloop is not installed"
                " (pip install 'webhook-worker[uvloop]', or set it to auto or asyncio)"
            )
        return "uvloop"
    if setting == "auto":
        return "uvloop" if uvloop_available and AUTO_PREFERS_UVLOOP else "asyncio"
    raise ValueError(f"worker.event_loop must be auto, asyncio or uvloop, not {setting!r}")


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What asyncio.Runner needs for the chosen loop (None: asyncio's own)."""
    if loop == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


# How long to wait for cancelled tasks before cancelling again those still running.
CANCEL_AGAIN_SECONDS = 0.5


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]],
                          again_seconds: float = CANCEL_AGAIN_SECONDS) -> None:
    """Cancel the tasks and wait until every one has ended, cancelling again those that run on.

    One cancel is not always enough: Python 3.11's asyncio.wait_for returns the inner result when it
    completes just as the cancel arrives, and psycopg_pool waits for a connection through it, so a
    loop cancelled there carries on. A worker stopped during start-up (its pool still connecting)
    waited forever so for its housekeeping loop. What the tasks raised is collected, not raised."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_seconds)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: asyncio would otherwise log it as never retrieved


def raised_open_files_limit(soft: int, hard: int, kernel_max: int) -> int | None:
    """The soft limit of open files to set so that thousands of sockets fit: the hard limit (the
    kernel's per-process maximum when the hard limit is unlimited, which setrlimit refuses for open
    files); None when the soft limit is already there."""
    if soft == resource.RLIM_INFINITY:
        return None
    target = kernel_max if hard == resource.RLIM_INFINITY else hard
    return target if target > soft else None


def _kernel_nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 1024 * 1024


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit; returns (before, after) when it changed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = raised_open_files_limit(soft, hard, _kernel_nr_open())
    if target is None:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return None  # the system refused: the worker runs with the limit it was given
    return soft, target
