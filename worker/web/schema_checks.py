"""Payloads checked against their types' JSON Schemas in processes of their own, within a time
budget. A check is CPU work in Python that no thread can interrupt; a process can be killed. So a
check that runs past the budget is cut off by killing its process (started again for the next),
and no schema or payload holds the API's event loop, or a CPU, longer than
api.schema_validation_budget_seconds.

Run as `python -m worker.web.schema_checks`, this module is such a process: it reads checks on its
standard input and writes their verdicts on its standard output as it reaches them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from worker.rules.event_types import EventType
from worker.rules.schemas import PayloadProblem, SchemaUnusable, checker, first_problem

# Each message of the protocol: its length (4 bytes, big-endian), then that much JSON.
_LENGTH_BYTES = 4
# A process ready to check says so first: the time it takes to start is not counted in any budget.
_READY = "ready"
# How long a process may take to start before the check it was started for fails (503).
START_TIMEOUT_SECONDS = 60.0
# How long a process asked to stop (its input closed) has before it is killed.
STOP_TIMEOUT_SECONDS = 2.0
# How often a process sends the verdicts it reached while it works through a request's checks (and
# at once when they are done): a message per verdict cost the API about 20 us each.
FLUSH_SECONDS = 0.01
# A check's process runs nothing else: a payload nested 254 deep against a recursive schema needs
# more frames than Python's default of 1000.
CHECK_RECURSION_LIMIT = 20_000


@dataclass(frozen=True)
class Check:
    """A payload (its JSON text) to check against a schema (its JSON text,
    worker.rules.schemas.schema_text)."""

    schema_text: str
    payload_text: str


class OverBudget:
    """The verdict of a check that was not done within the request's budget."""

    def __repr__(self) -> str:
        return "OVER_BUDGET"


OVER_BUDGET = OverBudget()
# None: the payload follows its schema.
Verdict = PayloadProblem | SchemaUnusable | OverBudget | None


class ChecksFailed(Exception):
    """A check's process ended without being killed for its budget (it crashed, or was killed from
    outside): the checks it had not answered are not judged."""


@dataclass
class Budget:
    """What a request's checks may take together, in seconds, and what is left of it."""

    seconds: float
    left: float = field(init=False)

    def __post_init__(self) -> None:
        self.left = self.seconds


class _Process:
    """One checking process: started when first needed, one batch of checks at a time."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            async with asyncio.timeout(START_TIMEOUT_SECONDS):
                ready = await self.receive()
        except (OSError, TimeoutError) as exc:
            raise ChecksFailed(f"a schema-check process did not start: {type(exc).__name__}") from None
        if ready != _READY:
            raise ChecksFailed("a schema-check process started with an unexpected answer")

    def send(self, message: bytes) -> None:
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(len(message).to_bytes(_LENGTH_BYTES, "big") + message)

    async def receive(self) -> Any:
        assert self._process is not None and self._process.stdout is not None
        try:
            length = int.from_bytes(await self._process.stdout.readexactly(_LENGTH_BYTES), "big")
            return orjson.loads(await self._process.stdout.readexactly(length))
        except asyncio.IncompleteReadError:
            raise ChecksFailed("a schema-check process ended") from None

    def kill(self, reaping: set[asyncio.Task[Any]]) -> None:
        """Kill the process at once (it may be in the middle of a check); it is reaped in the background."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        task = asyncio.get_running_loop().create_task(process.wait())
        reaping.add(task)
        task.add_done_callback(reaping.discard)

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        assert process.stdin is not None
        process.stdin.close()
        try:
            async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


class SchemaChecks:
    """`processes` checking processes shared by an API process's requests, each request's checks in
    one of them, one request at a time, the others waiting their turn (first come, first served).
    `overruns` counts the requests whose checks ran past their budget."""

    def __init__(self, processes: int, overruns: Any) -> None:
        self._idle: asyncio.Queue[_Process] = asyncio.Queue()
        for _ in range(processes):
            self._idle.put_nowait(_Process())
        self._all = processes
        self._overruns = overruns
        self._reaping: set[asyncio.Task[Any]] = set()

    async def judge(self, checks: Sequence[Check], budget: Budget) -> list[Verdict]:
        """A verdict for each check, in order; OVER_BUDGET for those not done within what is left of
        `budget` (which the time taken is subtracted from). Raises ChecksFailed when the process
        ends otherwise (the next request starts another)."""
        verdicts: list[Verdict] = [OVER_BUDGET] * len(checks)
        if not checks or budget.left <= 0:
            return verdicts
        loop = asyncio.get_running_loop()
        process = await self._idle.get()
        done = False
        try:
            if not process.running:
                await process.start()
            schemas: dict[str, int] = {}
            items = [(schemas.setdefault(check.schema_text, len(schemas)),
                      orjson.Fragment(check.payload_text)) for check in checks]
            process.send(orjson.dumps({"schemas": list(schemas), "checks": items}))
            started = loop.time()
            try:
                async with asyncio.timeout(budget.left):
                    answered = 0
                    while answered < len(checks):
                        for index, verdict in await process.receive():
                            verdicts[index] = _verdict(verdict)
                            answered += 1
                done = True
            except TimeoutError:
                self._overruns.inc()
            finally:
                budget.left -= loop.time() - started
        finally:
            if not done:
                # over budget, failed or cancelled: whatever it is in the middle of is not wanted
                process.kill(self._reaping)
            self._idle.put_nowait(process)
        return verdicts

    def for_request(self, budget_seconds: float) -> RequestChecks:
        return RequestChecks(self, Budget(budget_seconds))

    async def close(self) -> None:
        """Stop every process (each waits for the check it is running to end or be cut off)."""
        for _ in range(self._all):
            process = await self._idle.get()
            await process.stop()
        for task in list(self._reaping):
            await task


class RequestChecks:
    """One request's checks: its budget, and the verdicts reached so far, kept for the request's
    life: when the catalogue is read afresh, a check whose schema did not change is not run again."""

    def __init__(self, checks: SchemaChecks, budget: Budget) -> None:
        self.budget = budget
        self._checks = checks
        self._reached: dict[tuple[int, str], Verdict] = {}

    async def verdicts(self, wanted: Sequence[tuple[int, Check]]) -> list[Verdict]:
        """The verdict of each check, by its key in the request (a message's place in it)."""
        todo = [(key, check) for key, check in wanted if (key, check.schema_text) not in self._reached]
        found = await self._checks.judge([check for _, check in todo], self.budget)
        for (key, check), verdict in zip(todo, found, strict=True):
            self._reached[key, check.schema_text] = verdict
        return [self._reached[key, check.schema_text] for key, check in wanted]


def _verdict(found: Any) -> Verdict:
    if found is None:
        return None
    kind, *rest = found
    if kind == "payload":
        return PayloadProblem(*rest)
    return SchemaUnusable(*rest)


# --- The checking process ----------------------------------------------------------------------------


def _check(schema_text: str, payload: Any) -> Any:
    """One verdict, as it travels: null, ["payload", pointer, message] or ["schema", problem]."""
    try:
        problem = first_problem(checker(schema_text), payload)
    except SchemaUnusable as exc:
        return ["schema", str(exc)]
    except RecursionError:
        return ["payload", "", "nested too deep to be checked against its schema"]
    return None if problem is None else ["payload", problem.pointer, problem.message]


def _write(out: IO[bytes], value: Any) -> None:
    message = orjson.dumps(value)
    out.write(len(message).to_bytes(_LENGTH_BYTES, "big") + message)
    out.flush()


class _Answers:
    """The verdicts a process reaches for a request's checks: sent every FLUSH_SECONDS while the
    checks run (by a timer's signal, whose handler Python runs between two steps of even a long
    check; a thread of its own slowed the checks threefold, contending for the interpreter), and at
    once when they are done."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._reached: list[Any] = []
        self._sent = 0
        self._sending = False
        signal.signal(signal.SIGALRM, lambda _signum, _frame: self.send())

    def start(self) -> None:
        self._reached, self._sent = [], 0
        signal.setitimer(signal.ITIMER_REAL, FLUSH_SECONDS, FLUSH_SECONDS)

    def add(self, index: int, verdict: Any) -> None:
        self._reached.append([index, verdict])  # never replaced while checks run: nothing is lost

    def done(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.send()

    def send(self) -> None:
        if self._sending:  # the timer's handler, in the middle of a send
            return
        self._sending = True
        try:
            end = len(self._reached)
            if end > self._sent:
                _write(self._out, self._reached[self._sent:end])
                self._sent = end
        finally:
            self._sending = False


def serve(source: IO[bytes], out: IO[bytes]) -> None:
    """Answer checks until the input ends (the API process stopped, or closed it). A check cut off
    for its budget loses only the verdicts of the last moments before it."""
    _write(out, _READY)
    answers = _Answers(out)
    while header := source.read(_LENGTH_BYTES):
        request = orjson.loads(source.read(int.from_bytes(header, "big")))
        schemas = request["schemas"]
        answers.start()
        for index, (schema, payload) in enumerate(request["checks"]):
            answers.add(index, _check(schemas[schema], payload))
        answers.done()


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group: the API stops this process itself, by closing its input
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.setrecursionlimit(CHECK_RECURSION_LIMIT)
    serve(sys.stdin.buffer, sys.stdout.buffer)


async def with_problems(entries: list[EventType]) -> list[EventType]:
    """The entries, each one's problem worked out in a thread first: jsonschema's own check of a large
    stored schema takes up to a second of CPU, which the API's and the console's pages do not spend
    on their event loop (the result is kept, by the schema's text)."""
    await asyncio.to_thread(lambda: [entry.problem for entry in entries])
    return entries
