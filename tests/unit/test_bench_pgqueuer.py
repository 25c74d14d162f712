"""The benchmark's PGQueuer comparison without PGQueuer: the driver loads without the `bench` extra,
the section stops at once naming what is missing, and its target reads the median of its ratios."""

import argparse
import ast

import pytest

from bench.run import SECTIONS
from bench.sections import pgqueuer
from tests.support import ROOT

# What only the `bench` extra installs: the test tools (and so CI) never have them.
EXTRA_ONLY = {"pgqueuer", "asyncpg"}


def test_the_section_imports_the_bench_extra_only_inside_functions():
    """bench.run imports every section to list it: a module-level import of pgqueuer would break the
    whole benchmark (and its tests) wherever the extra is not installed."""
    tree = ast.parse((ROOT / "bench" / "sections" / "pgqueuer.py").read_text())
    top_level = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top_level.add(node.module)
    assert top_level  # the scan sees the module's imports
    assert not {name.split(".")[0] for name in top_level} & EXTRA_ONLY
    # the PGQueuer worker's own module imports pgqueuer at its top
    assert "bench.pgqueuer_consumer" not in top_level
    assert "pgqueuer" in SECTIONS and not SECTIONS["pgqueuer"].default


def test_without_the_extra_the_section_stops_naming_what_is_missing_and_how_to_install_it():
    with pytest.raises(RuntimeError) as raised:
        pgqueuer.require(("json", "no_such_module_for_the_bench"))
    message = str(raised.value)
    # only what is missing is named
    assert message.startswith("section pgqueuer needs no_such_module_for_the_bench, which the `bench` extra")
    assert ".[bench]" in message
    pgqueuer.require(("json",))  # nothing missing: no error


def ratio_results(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"pgqueuer": {
        "webhook_worker_over_pgqueuer": {"median": ordered[1], "values": values},
        "webhook_worker_uvloop_over_pgqueuer": {"median": ordered[1], "values": values},
    }}


@pytest.mark.parametrize(("values", "result"), [([1.2, 1.35, 1.5], "PASS"), ([1.0, 1.29, 1.6], "MISS")])
def test_the_target_is_the_median_of_the_three_ratios_against_1_3(values, result):
    rows = list(pgqueuer.targets(ratio_results(values), argparse.Namespace()))
    assert rows[0]["result"] == result and rows[0]["goal"] == "≥ 1.3×"
    assert all(f"{v:.2f}" in rows[0]["figure"] for v in values)
    # the uvloop pair is printed beside it, without a target
    assert rows[1]["result"] == "n/a"
