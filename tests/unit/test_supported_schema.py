"""The schema range a worker supports: one constant, stated in README as it is."""

import re

from tests.support import ROOT
from worker import schema


def test_readme_states_the_supported_schema_range_from_the_constants():
    [ready_row] = [row for row in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
                   if row.startswith("| `/ready` |")]
    stated = re.search(r"supports \((\d+)–(\d+)\b", ready_row)
    assert stated is not None, ready_row
    assert (int(stated[1]), int(stated[2])) == (schema.MIN_SUPPORTED_VERSION, schema.MAX_SUPPORTED_VERSION)


def test_this_release_needs_the_baseline_and_supports_its_own_schema():
    # the baseline holds worker liveness, which the worker claims under: nothing older looks ready
    [baseline] = [m.version for m in schema.load_migrations() if m.name == "baseline"]
    assert baseline <= schema.MIN_SUPPORTED_VERSION
    assert schema.MIN_SUPPORTED_VERSION <= schema.latest_version() <= schema.MAX_SUPPORTED_VERSION
