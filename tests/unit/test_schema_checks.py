"""Payloads checked in processes of their own (worker.web.schema_checks), without a database: the
verdicts, a check cut off at its budget by killing its process (and the next one served by a new
process), a request's budget shared by its checks, and a process that dies."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from worker.rules.schemas import PayloadProblem, SchemaUnusable, schema_text
from worker.web.schema_checks import OVER_BUDGET, Budget, Check, ChecksFailed, SchemaChecks

INVOICE = schema_text({"type": "object", "required": ["invoice_id"],
                       "properties": {"invoice_id": {"type": "string"}}})
# jsonschema compares unhashable items pairwise: 20,000 distinct objects are 2e8 comparisons, minutes
UNIQUE = schema_text({"type": "array", "uniqueItems": True})
HOSTILE = json.dumps([{"n": i} for i in range(20_000)])


def counter() -> Counter:
    return Counter("over_budget", "test", registry=CollectorRegistry())


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 120))


def test_verdicts_come_back_in_order_and_a_stored_schema_that_breaks_the_rules_is_named():
    async def scenario():
        checks = SchemaChecks(1, counter())
        try:
            return await checks.judge([
                Check(INVOICE, '{"invoice_id": "in_1"}'),
                Check(INVOICE, '{"invoice_id": 7}'),
                Check(schema_text({"$ref": "http://127.0.0.1:9/x"}), "{}"),
                Check(INVOICE, "[]"),
            ], Budget(30))
        finally:
            await checks.close()

    follows, wrong, unusable, not_object = run(scenario())
    assert follows is None
    assert wrong == PayloadProblem("/invoice_id", "expected a string, got the number 7")
    assert isinstance(unusable, SchemaUnusable) and "points outside the schema" in str(unusable)
    assert not_object == PayloadProblem("", "expected an object, got an array of 0 items")


def test_a_check_past_its_budget_is_cut_off_and_the_next_request_gets_a_new_process():
    overruns = counter()

    async def scenario():
        checks = SchemaChecks(1, overruns)
        try:
            budget = Budget(0.5)
            started = time.monotonic()
            cut = await checks.judge([Check(INVOICE, '{"invoice_id": "a"}'), Check(UNIQUE, HOSTILE),
                                      Check(INVOICE, '{"invoice_id": "b"}')], budget)
            waited = time.monotonic() - started
            # the request's budget is spent: nothing more is checked for it
            after = await checks.judge([Check(INVOICE, '{"invoice_id": "c"}')], budget)
            fresh = await checks.judge([Check(INVOICE, '{"invoice_id": 1}')], Budget(30))
            return cut, waited, budget.left, after, fresh
        finally:
            await checks.close()

    cut, waited, left, after, fresh = run(scenario())
    # the check before the hostile one keeps its verdict; the hostile one and those after it are over
    assert cut == [None, OVER_BUDGET, OVER_BUDGET]
    assert waited < 60  # not the minutes the check would have taken
    assert left <= 0 and after == [OVER_BUDGET]
    assert fresh == [PayloadProblem("/invoice_id", "expected a string, got the number 1")]
    assert overruns._value.get() == 1


def test_requests_wait_their_turn_for_a_process_and_their_waits_are_not_counted():
    async def scenario():
        checks = SchemaChecks(1, counter())
        try:
            await checks.judge([Check(INVOICE, "{}")], Budget(30))  # started
            slow = asyncio.create_task(checks.judge([Check(UNIQUE, HOSTILE)], Budget(1.0)))
            await asyncio.sleep(0)
            waiting = Budget(0.5)
            quick = await checks.judge([Check(INVOICE, '{"invoice_id": "x"}')], waiting)
            return await slow, quick, waiting.left
        finally:
            await checks.close()

    slow, quick, left = run(scenario())
    assert slow == [OVER_BUDGET]
    assert quick == [None] and left > 0  # its second of waiting was not taken from its budget


def test_a_process_that_dies_fails_its_checks_and_the_next_request_starts_another():
    async def scenario():
        checks = SchemaChecks(1, counter())
        try:
            await checks.judge([Check(INVOICE, "{}")], Budget(30))
            process = checks._idle._queue[0]._process  # the one process, idle
            judging = asyncio.create_task(checks.judge([Check(UNIQUE, HOSTILE)], Budget(60)))
            await asyncio.sleep(0.2)
            process.kill()
            with pytest.raises(ChecksFailed):
                await judging
            return await checks.judge([Check(INVOICE, '{"invoice_id": "x"}')], Budget(30))
        finally:
            await checks.close()

    assert run(scenario()) == [None]
