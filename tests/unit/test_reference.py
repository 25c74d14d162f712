"""docs/reference/ says what the code does: each page is compared with its generator's output or
with the source it describes, and README and docs/ stay a map of the repository, not a diary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts import gen_reference
from tests.support import ROOT
from worker.api.routes import ROUTES

REFERENCE = ROOT / "docs" / "reference"
# README, the changelog and every page of docs/: what a reader reads.
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
# `/v1/…` paths the HTTP API guide names that are not routes, and why.
NOT_ROUTES = {"/v1/problems/": "the prefix of the problem documents' type URIs"}


def section(text: str, heading: str) -> str:
    """The part of a page under one heading, up to the next heading of any level."""
    start = text.index(heading + "\n")
    following = re.search(r"^#{1,6} ", text[start + len(heading):], re.MULTILINE)
    return text[start: start + len(heading) + following.start()] if following else text[start:]


@pytest.mark.parametrize("name", sorted(gen_reference.PAGES))
def test_a_generated_page_is_what_its_source_renders(name: str):
    expected = gen_reference.rendered(dsn=None)[name]
    assert (REFERENCE / name).read_text(encoding="utf-8") == expected, (
        f"docs/reference/{name} is stale: run python -m scripts.gen_reference")


def test_the_cli_page_documents_every_command_and_option():
    import argparse

    from worker.cli import build_parser

    text = (REFERENCE / "cli.md").read_text(encoding="utf-8")
    parser = build_parser()
    commands = gen_reference.cli_commands()
    assert ["endpoints", "add"] in commands and ["demo"] in commands
    for words in commands:
        part = section(text, "### " + " ".join(["webhook-worker", *words]))
        sub = parser
        for word in words:
            sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
        options = {option for action in sub._actions for option in action.option_strings
                   if option not in ("-h", "--help", "--config")}
        missing = sorted(option for option in options if f"`{option}`" not in part)
        assert not missing, f"webhook-worker {' '.join(words)}: {missing} not in docs/reference/cli.md"
        positionals = [action for action in sub._actions
                       if not action.option_strings and not isinstance(action, argparse._SubParsersAction)]
        for action in positionals:
            assert gen_reference.cell(f"`{gen_reference._value(action)}`") in part, (words, action.dest)


def test_the_exit_status_table_is_the_cli_s():
    from worker import cli

    text = (REFERENCE / "cli.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d) \| (.+) \|$", text, re.MULTILINE)
    stated = {int(status): meaning for status, meaning in rows}
    assert set(stated) == {0, 1, 2}
    assert cli.EXIT_FAILURE == 1 and stated[1].startswith("understood but not done")
    assert cli.EXIT_USAGE == 2 and stated[2].startswith("what was given is wrong")


def test_every_configuration_key_has_its_row_and_meaning():
    text = (REFERENCE / "configuration.md").read_text(encoding="utf-8")
    keys = [key for key, _field in gen_reference.config_keys()]
    assert "api.metrics_port" in keys
    assert set(keys) == set(gen_reference.CONFIG_MEANINGS)  # the generator refuses a key without one
    for key in keys:
        assert f"| `{key}`<br>" in text, key


def test_the_fleet_defaults_table_names_every_key_config_set_takes():
    from worker.store.settings import SETTABLE

    part = section((REFERENCE / "configuration.md").read_text(encoding="utf-8"),
                   "## The fleet's defaults (`config set`)")
    named = {key for row in re.findall(r"^\| (`.+?`) \|", part, re.MULTILINE)
             for key in re.findall(r"`(\w+)`", row)}
    assert named - {"key"} == set(SETTABLE)


def test_every_metric_is_on_the_metrics_page():
    text = (REFERENCE / "metrics.md").read_text(encoding="utf-8")
    names = gen_reference.metric_names()
    assert "`webhook_worker_deliveries_total`" in names and "`webhook_api_requests_total`" in names
    assert all(f"| {name} |" in text for name in names)


def test_the_http_api_guide_names_only_routes_that_exist_and_each_route_s_roles():
    text = (REFERENCE / "http-api.md").read_text(encoding="utf-8")
    served = {(route.method, route.path) for route in ROUTES}
    paths = {path for _method, path in served}
    named = {p.split("?")[0] for p in re.findall(r"(/v1/[\w{}./-]*)", text)}
    unknown = sorted(named - paths - set(NOT_ROUTES))
    assert not unknown, f"docs/reference/http-api.md names paths the API does not serve: {unknown}"
    pairs = set(re.findall(r"\b(GET|POST|PATCH|PUT|DELETE) (/v1/[\w{}./-]*)", text))
    assert pairs - served == set(), sorted(pairs - served)
    roles = section(text, "## Authentication and roles")
    table = {pair for row in re.findall(r"^\| (`(?:GET|POST|PATCH|PUT|DELETE) .+?) \|", roles, re.MULTILINE)
             for pair in re.findall(r"(GET|POST|PATCH|PUT|DELETE) (/v1/[\w{}./-]*)", row)}
    assert table == served, f"the roles table misses {sorted(served - table)}"
    # and each row names the roles its routes are declared with
    declared = {(route.method, route.path): set(route.roles) for route in ROUTES}
    rows = re.findall(r"^\| (`(?:GET|POST|PATCH|PUT|DELETE) .+?) \| (.+?) \|$", roles, re.MULTILINE)
    for row, cell in rows:
        named_roles = set(re.findall(r"\b(producer|reader|admin|tenant_admin)\b", cell))
        for pair in re.findall(r"(GET|POST|PATCH|PUT|DELETE) (/v1/[\w{}./-]*)", row):
            if named_roles:  # "any valid token", "anyone": no role named
                assert declared[pair] == named_roles, (pair, sorted(declared[pair]), cell)


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300, f"README.md has {len(lines)} lines; move reference material to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_page_reads_as_what_is_not_as_a_work_log(page: Path):
    text = page.read_text(encoding="utf-8")
    log = re.findall(r".{0,30}\b(?:[Ii]ssue #?\d+|[Ss]top \d+|[Rr]ound of issue)\b.{0,30}", text)
    assert not log, f"{page.relative_to(ROOT)}: issue numbers and work-log words belong in git history: {log}"


# What a test, a module or a benchmark cites instead of saying what it checks or does.
TRACKER = re.compile(r".{0,30}\b(?:[Ii]ssue #?\d+|[Tt]he issue(?:'s)?|[Ss]top \d+|[Rr]ound of issue)\b"
                     r".{0,30}")
CODE = sorted(path for folder in ("worker", "tests", "bench", "scripts")
              for path in (ROOT / folder).rglob("*.py"))


def test_code_and_tests_say_what_they_check_not_which_tracker_entry_asked_for_it():
    cited = {str(path.relative_to(ROOT)): found for path in CODE
             if (found := TRACKER.findall(path.read_text(encoding="utf-8")))}
    assert cited == {}


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_link_to_a_file_stays_inside_the_repository_and_finds_its_target(page: Path):
    text = page.read_text(encoding="utf-8")
    problems = []
    for target in LINK.findall(text):
        if re.match(r"^https?://", target):
            continue  # a public page (a specification), not a file of ours
        if re.match(r"^[a-z]+:", target):
            problems.append(f"{target}: links outside the repository")
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.is_relative_to(ROOT.resolve()) or not path.exists():
            problems.append(f"{target}: no such file in the repository")
        elif anchor and path.suffix == ".md":
            headings = re.findall(r"^#{1,6} (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
            if anchor not in {slug(h) for h in headings}:
                problems.append(f"{target}: no such heading in {path.relative_to(ROOT.resolve())}")
    assert not problems, f"{page.relative_to(ROOT)}: {problems}"
