"""The HTTP API's pure decisions: token shape, cursors, bulk-replay pacing, traceparent."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from worker.api.inputs import dead_letter_cursor, encode_dead_letter_cursor
from worker.api.messages import _valid_traceparent
from worker.rules import tokens
from worker.rules.pacing import rate_problem, step_plan
from worker.web.problems import Problem


def test_generated_tokens_are_unique_prefixed_and_well_formed():
    made = {tokens.generate_token() for _ in range(200)}
    assert len(made) == 200
    assert all(t.startswith("whk_") and tokens.well_formed(t) for t in made)
    assert not tokens.well_formed("whk_short") and not tokens.well_formed("ghp_" + "a" * 43)
    assert tokens.token_hash("whk_x") != tokens.token_hash("whk_y") and len(tokens.token_hash("a")) == 32


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("ci", None),
        ("", "must not be empty"),
        (" ", "must not be empty"),
        ("a\nb", "must be printable"),
        ("x" * 201, "at most 200"),
    ],
)
def test_token_names(name, problem):
    found = tokens.name_problem(name)
    assert (found is None) if problem is None else (problem in found)


def test_dead_letter_cursors_round_trip_and_refuse_anything_else():
    for at in (datetime(2026, 11, 26, 12, 0, tzinfo=UTC),
               datetime(2026, 11, 26, 12, 0, 0, 123456, tzinfo=UTC)):
        assert dead_letter_cursor(encode_dead_letter_cursor(at, 42)) == (at, 42)
    for bad in ("", "!!!", "12", "12.0", "-5.3", "1.2.3", "99999999999999999.1", "1." + "9" * 19):
        with pytest.raises(Problem) as refused:
            dead_letter_cursor(bad)
        assert refused.value.field == "cursor"


@pytest.mark.parametrize(
    ("rows", "rate", "expected"),
    [
        (100, None, (100, 0.0)),
        (100, 10.0, (10, 1.0)),
        (100, 0.5, (1, 2.0)),
        (5, 1000.0, (5, 0.005)),
    ],
)
def test_a_bulk_replay_keeps_to_its_rate_in_whole_steps(rows, rate, expected):
    assert step_plan(rows, rate) == pytest.approx(expected)


@pytest.mark.parametrize("rate", [math.inf, math.nan, 0.0, -1.0, 0.0009, 100_001.0])
def test_a_rate_outside_its_bounds_is_refused_and_an_operation_stored_with_one_still_steps(rate):
    assert rate_problem(rate) == "rows a second, from 0.001 to 100000"
    # the runner steps every operation of its process: one stored by hand must not stop the others
    assert step_plan(100, rate) == (100, 0.0)


def test_the_rates_bounds_themselves_are_rates():
    assert rate_problem(0.001) is None and rate_problem(100_000) is None


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", True),
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", False),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", False),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", False),
        ("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", False),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nX: y", False),
    ],
)
def test_traceparent_is_checked_as_the_queue_constraint_checks_it(value, valid):
    assert _valid_traceparent(value) is valid
