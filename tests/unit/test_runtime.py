"""The worker process's event loop choice, how its tasks are ended, and its open-files limit."""

from __future__ import annotations

import asyncio
import contextlib
import resource

import pytest

from worker import runtime
from worker.config import WorkerConfig

INF = resource.RLIM_INFINITY


def test_asyncio_and_uvloop_are_taken_as_set() -> None:
    assert runtime.chosen_loop("asyncio", True) == "asyncio"
    assert runtime.chosen_loop("uvloop", True) == "uvloop"


def test_uvloop_when_not_installed_is_an_error_naming_the_setting_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"worker\.event_loop.*not installed.*webhook-worker\[uvloop\]"):
        runtime.chosen_loop("uvloop", False)


def test_auto_follows_the_measured_decision_and_needs_uvloop_installed() -> None:
    assert runtime.chosen_loop("auto", False) == "asyncio"
    assert runtime.chosen_loop("auto", True) == ("uvloop" if runtime.AUTO_PREFERS_UVLOOP else "asyncio")


def test_an_unknown_loop_is_refused_by_the_config_naming_the_key() -> None:
    with pytest.raises(ValueError, match="event_loop"):
        WorkerConfig(event_loop="trio")  # type: ignore[arg-type]
    assert WorkerConfig().event_loop == "auto"


def test_the_loop_factory_is_uvloops_for_uvloop_and_asyncios_own_otherwise() -> None:
    assert runtime.loop_factory("asyncio") is None
    if runtime.uvloop_installed():
        import uvloop

        assert runtime.loop_factory("uvloop") is uvloop.new_event_loop


@pytest.mark.parametrize(("soft", "hard", "expected"), [
    (1024, 524288, 524288),   # the usual container default: raised to the hard limit
    (1024, INF, 1048576),     # unlimited hard limit: the kernel's per-process maximum
    (524288, 524288, None),   # already there
    (INF, INF, None),         # nothing to raise
])
def test_the_open_files_soft_limit_is_raised_to_the_hard_limit(
    soft: int, hard: int, expected: int | None
) -> None:
    assert runtime.raised_open_files_limit(soft, hard, kernel_max=1048576) == expected


async def _carries_on_after_one_cancel(ended: asyncio.Event) -> None:
    """What a loop does when a cancel is swallowed on its way (as asyncio.wait_for may on Python 3.11):
    it carries on to its next pause."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)
    try:
        await asyncio.sleep(3600)
    finally:
        ended.set()


def test_cancel_and_wait_ends_a_task_that_swallowed_the_first_cancel() -> None:
    async def scenario() -> bool:
        ended = asyncio.Event()
        task = asyncio.create_task(_carries_on_after_one_cancel(ended))
        await asyncio.sleep(0)  # it is in its first pause
        # (a hang guard only: a second cancel comes after 0.01 s, well within it)
        await asyncio.wait_for(runtime.cancel_and_wait([task], again_seconds=0.01), timeout=60)
        return task.cancelled() and ended.is_set()

    assert asyncio.run(scenario())


def test_cancel_and_wait_collects_what_the_tasks_raised() -> None:
    async def fails() -> None:
        raise RuntimeError("broken")

    async def scenario() -> list[bool]:
        tasks = [asyncio.create_task(fails()), asyncio.create_task(asyncio.sleep(3600))]
        await asyncio.sleep(0)
        await runtime.cancel_and_wait(tasks)
        return [task.cancelled() for task in tasks]

    assert asyncio.run(scenario()) == [False, True]
