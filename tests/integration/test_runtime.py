"""The worker process's event loop setting and its open-files limit, in a real `webhook-worker`."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from tests.support import add_endpoint, enqueue, eventually, statuses
from worker import runtime


@pytest.mark.skipif(not runtime.uvloop_installed(), reason="uvloop (the optional extra) is not installed")
def test_a_worker_on_uvloop_delivers(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/hook"))
    [delivery] = enqueue(db, endpoint)
    worker = spawn(db, worker={"event_loop": "uvloop"})
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", message="delivered")
    [chosen] = [line for line in worker.log_lines() if line.get("event") == "event loop chosen"]
    assert (chosen["loop"], chosen["setting"]) == ("uvloop", "uvloop")
    assert len(receiver.to("/hook")) == 1


def test_a_worker_raises_its_open_files_soft_limit_to_the_hard_limit(db, spawn):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Low, but above what this test process has open already (the tests an xdist process ran before
    # leave it sockets and files), so that starting the worker can still open its pipes.
    low = max(256, len(list(Path("/proc/self/fd").iterdir())) + 64)
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.skip("the hard limit leaves nothing to raise")
    # The worker inherits a low soft limit, as under a container's usual 1,024.
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        worker = spawn(db)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    raised = eventually(lambda: [line for line in worker.log_lines()
                                 if line.get("event") == "open-files soft limit raised"],
                        message="the raise logged")
    expected = runtime.raised_open_files_limit(low, hard, runtime._kernel_nr_open())
    assert (raised[0]["before"], raised[0]["after"]) == (low, expected)
    eventually(lambda: _soft_limit(worker.pid) == expected, message="the process's soft limit")


def _soft_limit(pid: int) -> int | None:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    return None
