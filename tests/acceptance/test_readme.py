"""Every command README.md and the pages under docs/ show, run as a user would against throwaway
databases.

The pages are read when the test runs, so a command added to one later is run too. Shell blocks are
followed in order like a terminal session (exports carry on); each of README's `##` sections gets a
fresh migrated database, since its sections are separate stories, and each page of docs/ one
database, since a page is one story. A page of docs/ starts where README's "Using it" leaves a
reader: DATABASE_URL and the encryption keys exported. Only URLs, the database, the encryption key
and the local port are substituted; a command that cannot run here must be listed in NOT_RUN (or
an SQL statement in NOT_RUN_SQL) with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests.receiver import Receiver, Reply
from tests.support import ROOT, TEST_KEYS
from worker.cli import build_parser
from worker.cli.process import cmd_api, cmd_run
from worker.encryption import KEYS_ENV
from worker.rules import signing

README = ROOT / "README.md"
# README first, then every page of docs/, by path.
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
PROGRAM = "webhook-worker"
# What README shows that cannot run on this machine or inside a test, by how the command starts.
NOT_RUN = {
    "pip install ": "installs the package, as the suite's .venv already has it (scripts/bootstrap.sh)",
    "bash scripts/demo.sh": "installs into .venv; test_cli.py runs the demo itself (`webhook-worker demo`)",
    "bash scripts/test.sh": "the whole test suite, which this test is part of",
    "bash scripts/test-at.sh": "the whole test suite again, under a moved clock",
    "bash scripts/bench.sh": "the benchmark takes about 20 minutes",
    "WEBHOOK_STATEFUL_EXAMPLES=": "the long run of the rules' state machine takes half an hour or more; the "
                                  "suite runs its bounded setting (tests/api/test_rules_model.py)",
    "docker ": "needs a Docker engine, and none runs here (test_deploy.py checks the Compose file offline)",
    "kubectl ": "needs a Kubernetes cluster (test_deploy.py checks the manifests offline)",
    "(cd k8s/": "kustomize edit changes the checked-in kustomization (test_deploy.py checks that its "
                "images entry names the manifests' image)",
    "open ": "opens a browser on Prometheus, which runs only under Docker Compose",
}
# SQL that docs/ shows and that cannot run here, by how the statement starts.
NOT_RUN_SQL = {
    "CREATE ROLE ": "logins are cluster-wide and the cluster is shared by the suite's tests, which make "
                    "the same logins themselves (tests/support.py: the workers' and the API's)",
    "REVOKE CONNECT ON DATABASE yourdb": "names the reader's own database",
    "GRANT CONNECT ON DATABASE yourdb": "names the reader's own database and logins",
}
# `python -m scripts.gen_reference` rewrites docs/reference/; here it runs with --check, so the test
# changes no file and fails when a page is stale.
GENERATOR = ["-m", "scripts.gen_reference"]
# Set for every command: where this machine differs from the one README imagines.
MACHINE = {
    "WEBHOOK_WORKER_SECURITY__ALLOW_NETWORKS": '["127.0.0.1/32"]',  # the receiver is on loopback
    "WEBHOOK_WORKER_HTTP__HOST": "127.0.0.1",  # tests listen on loopback only
    "WEBHOOK_WORKER_HTTP__PORT": "0",  # 8080 may be taken
    "WEBHOOK_WORKER_LOGGING__FORMAT": "json",
    "WEBHOOK_WORKER_API__HOST": "127.0.0.1",
    "WEBHOOK_WORKER_API__PORT": "0",  # 8000 may be taken; curl's localhost:8000 is pointed at it
    "WEBHOOK_WORKER_API__METRICS_PORT": "0",  # 8001 may be taken
}
# README's curl examples address the API here; they are sent to the `webhook-worker api` it started.
README_API = "http://localhost:8000"
# Hang guards for a process's start-up and a command's run, generous enough for a loaded machine.
WORKER_READY_SECONDS = 120.0
COMMAND_SECONDS = 120.0


@dataclass(frozen=True)
class Snippet:
    kind: str  # "shell", "inline" (a `webhook-worker …` code span in prose) or "sql"
    text: str
    line: int
    section: str
    page: str = "README.md"

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.section}): {self.text}"

    @property
    def story(self) -> str:
        """What shares one database: a section of README, a whole page of docs/."""
        return self.section if self.page == "README.md" else self.page


def page_snippets(path: Path) -> list[Snippet]:
    """snippets() of one page, each naming the page."""
    name = str(path.relative_to(ROOT))
    found = snippets(path.read_text(encoding="utf-8"))
    return [Snippet(s.kind, s.text, s.line, s.section, name) for s in found]


def snippets(markdown: str) -> list[Snippet]:
    """Every shell command, SQL statement and inline `webhook-worker …` span, in the page's order."""
    found: list[Snippet] = []
    lines = markdown.splitlines()
    section, index = "top", 0
    prose: list[tuple[int, str]] = []
    while index < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[index])
        if fence is None:
            heading = re.match(r"^## (.+)", lines[index])
            if heading:
                found += inline_spans(prose, section)
                section, prose = heading.group(1).strip(), []
            prose.append((index + 1, lines[index]))
            index += 1
            continue
        found += inline_spans(prose, section)
        prose = []
        body = []
        index += 1
        while index < len(lines) and not lines[index].startswith("```"):
            body.append((index + 1, lines[index]))
            index += 1
        index += 1
        if fence.group(1) in SHELL_LANGUAGES:
            found += [Snippet("shell", text, line, section) for line, text in shell_lines(body)]
        elif fence.group(1) == "sql":
            found += [Snippet("sql", text, line, section) for line, text in sql_statements(body)]
    return found + inline_spans(prose, section)


def inline_spans(prose: list[tuple[int, str]], section: str) -> list[Snippet]:
    text = "\n".join(line for _, line in prose)
    spans = []
    for match in re.finditer(r"`([^`]+)`", text):
        content = " ".join(match.group(1).split())  # a span may wrap onto the next line
        if content.startswith(PROGRAM + " "):
            line = prose[0][0] + text.count("\n", 0, match.start())
            spans.append(Snippet("inline", content, line, section))
    return spans


HEREDOC = re.compile(r"(?<!<)<<-?\s*(['\"]?)(\w+)\1\s*$")


def shell_lines(body: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Logical command lines: continuations joined, comment-only and blank lines dropped, and a
    here-document turned into the here-string of the same text."""
    pending, start = "", 0
    lines = iter(body)
    for line, text in lines:
        if not pending:
            start = line
        if text.rstrip().endswith("\\"):
            pending += text.rstrip()[:-1] + " "
            continue
        command = (pending + text).strip()
        pending = ""
        heredoc = HEREDOC.search(command)
        if heredoc:
            document = []
            for _, text in lines:
                if text.strip() == heredoc.group(2):
                    break
                document.append(text)
            command = command[:heredoc.start()] + "<<< " + shlex.quote("\n".join(document))
        if command and not command.startswith("#"):
            yield start, command


def sql_statements(body: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Statements split at semicolons outside quotes and $$-quoted bodies, comments dropped."""
    statement, start, quoted, dollar = "", 0, False, False
    for line, text in body:
        index = 0
        while index < len(text):
            char = text[index]
            if not quoted and text.startswith("--", index):
                break
            if not statement.strip():
                start = line
            if char == "'" and not dollar:
                quoted = not quoted
            if not quoted and text.startswith("$$", index):
                dollar = not dollar
                statement += "$$"
                index += 2
                continue
            if char == ";" and not quoted and not dollar:
                yield start, " ".join(statement.split()) + ";"
                statement = ""
            else:
                statement += char
            index += 1
        statement += " "
    assert not statement.strip(), f"README.md: an SQL statement without its semicolon: {statement}"


def synopsis(text: str) -> bool:
    """`webhook-worker endpoints circuit NAME reset|open [--until TIME]|close`: a form, not a command."""
    return bool(re.search(r"[\[\]|]|\b[A-Z]{2,}\b", text))


def synopsis_problem(text: str) -> str | None:
    """Whether the commands and options a synopsis names exist."""
    parser = build_parser()
    words = [w for w in re.split(r"[\s|\[\]]+", text)[1:] if w]
    for word in words:
        groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if groups and word in groups[0].choices:
            parser = groups[0].choices[word]
    known = {option for action in parser._actions for option in action.option_strings}
    unknown = [w for w in words if w.startswith("--") and w not in known]
    return f"no such option {unknown} in `{parser.prog}`" if unknown else None


@dataclass
class Run:
    """A terminal session following README: exports, one database per section, a receiver."""

    receiver: Receiver
    make_db: Callable[[], str]
    workdir: Path
    exported: dict[str, str] = field(default_factory=dict)
    databases: dict[str, str] = field(default_factory=dict)
    urls: int = 0
    # the `webhook-worker api` README started, running for the commands after it: (line, process, port)
    api: tuple[Snippet, subprocess.Popen[bytes], int] | None = None

    def database(self, story: str) -> str:
        if story not in self.databases:
            self.databases[story] = self.make_db()
        return self.databases[story]

    def receiver_url(self) -> str:
        self.urls += 1
        path = f"/readme/{self.urls}"
        self.receiver.script(path, Reply(echo=True))  # echoes a --verify challenge too
        return self.receiver.url(path)

    def env_value(self, name: str, value: str, story: str) -> str:
        if name == "DATABASE_URL":
            return self.database(story)
        if name == KEYS_ENV and "…" in value:
            return self.exported.get(KEYS_ENV, TEST_KEYS)
        return value

    def placeholder(self, option: str) -> str:
        """What a user would feed an option from a file or standard input."""
        if "url" in option:
            return self.receiver_url()
        if "secret" in option:
            return signing.generate_secret()
        if "header" in option:
            return "X-Readme-Test: placeholder"
        if "key" in option:  # the keys this session holds, so they open what it sealed
            return self.exported.get(KEYS_ENV, TEST_KEYS)
        return '{"test": true}'


def substitute_subshells(snippet: Snippet, session: Run, failures: list[str]) -> str:
    """Run each `$(webhook-worker …)` and put its output in place, then expand the variables this
    session exported (outside single quotes), as the shell would. Other variables stay as written."""
    def evaluate(match: re.Match[str]) -> str:
        inner = Snippet(snippet.kind, match.group(1), snippet.line, snippet.section, snippet.page)
        result = run_program(inner, shlex.split(inner.text), {}, None, session, failures)
        return result.stdout.strip() if result is not None else ""

    def expand(match: re.Match[str]) -> str:
        return session.exported.get(match.group(1) or match.group(2), match.group(0))

    text = re.sub(rf"\$\(({PROGRAM} [^()]*)\)", evaluate, snippet.text)
    pieces = re.split(r"('[^']*')", text)  # odd pieces are single-quoted
    return "".join(piece if at % 2 else re.sub(r"\$\{(\w+)\}|\$(\w+)", expand, piece)
                   for at, piece in enumerate(pieces))


@dataclass
class Line:
    """One shell command line, taken apart as the shell would."""

    words: list[str]  # the program and its arguments
    env: dict[str, str]  # NAME=value before the program, as written
    stdin: str | None = None  # literal text fed on standard input
    stdin_for: str | None = None  # or the option whose value the user feeds on standard input


def parse_line(text: str) -> Line:
    """Environment prefix, words, and standard input: a pipe from echo, a here-string or a typed
    value is text when README spells it out; a file (`< file`), a variable, another program's output
    or `-` alone is something of the user's, replaced by a placeholder for the option reading it."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|<;&")
    lexer.whitespace_split, lexer.commenters = True, "#"
    tokens = list(lexer)
    assert not {";", "&&", "||", "&"} & set(tokens), f"{text}: one command per line, please"
    spelled_out: str | None = None
    fed = False
    if "|" in tokens:
        producer, tokens = tokens[:tokens.index("|")], tokens[tokens.index("|") + 1:]
        fed = True
        if producer[0] == "echo" and not any("$" in w or "…" in w for w in producer):
            spelled_out = " ".join(producer[1:]) + "\n"
    if "<<<" in tokens:
        at = tokens.index("<<<")
        word, tokens, fed = tokens[at + 1], tokens[:at] + tokens[at + 2:], True
        if "$" not in word and "…" not in word:
            spelled_out = word + "\n"
    elif "<" in tokens:
        at = tokens.index("<")
        tokens, fed = tokens[:at] + tokens[at + 2:], True
    env = {}
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        env[name] = value
    if spelled_out is not None:
        return Line(tokens, env, stdin=spelled_out)
    if fed or "-" in tokens:
        return Line(tokens, env, stdin_for=option_before(tokens, "-"))
    return Line(tokens, env)


def run_shell(snippet: Snippet, session: Run, failures: list[str]) -> str:
    """Run one logical line; returns how it was handled."""
    for prefix, reason in NOT_RUN.items():
        if snippet.text.startswith(prefix):
            substitute_subshells(snippet, session, failures)  # a command inside one still runs
            return f"not run: {reason}"
    expected = re.search(r"#\s*exits (\d+)", snippet.text)
    line = parse_line(substitute_subshells(snippet, session, failures))
    if line.words[0] == "export":
        name, _, value = line.words[1].partition("=")
        session.exported[name] = session.env_value(name, value, snippet.story)
        return "ran: export"
    env = {name: session.env_value(name, value, snippet.story) for name, value in line.env.items()}
    if line.words[0] == "psql":
        return run_psql(snippet, line.words, session, failures)
    if line.words[:2] == ["cp", "config.example.yaml"] and len(line.words) == 3:
        # the user's copy of the commented example, which the commands after it read
        shutil.copyfile(ROOT / "config.example.yaml", session.workdir / line.words[2])
        return "ran: cp"
    if line.words[0] == "curl":
        return run_curl(snippet, line.words, session, failures)
    if line.words[0] in ("python", "python3") and line.words[1:3] == GENERATOR:
        return run_generator(snippet, line.words[3:], failures)
    if line.words[0] != PROGRAM:
        failures.append(f"{snippet}\n  neither `{PROGRAM}`, psql, curl, the reference generator "
                        "nor listed in NOT_RUN")
        return "unclassified"
    stdin = line.stdin
    if line.stdin_for is not None:
        stdin = session.placeholder(line.stdin_for) + "\n"
    run_program(snippet, line.words, env, stdin, session, failures,
                expected=int(expected.group(1)) if expected else 0)
    return "ran"


def option_before(tokens: list[str], value: str) -> str:
    at = tokens.index(value) if value in tokens else 0
    return tokens[at - 1] if at > 0 and tokens[at - 1].startswith("--") else ""


def run_psql(snippet: Snippet, tokens: list[str], session: Run, failures: list[str]) -> str:
    assert "-c" in tokens, f"{snippet}: only `psql … -c SQL` is understood here"
    run_sql(Snippet("sql", tokens[tokens.index("-c") + 1], snippet.line, snippet.section, snippet.page),
            session, failures)
    return "ran"


def run_generator(snippet: Snippet, args: list[str], failures: list[str]) -> str:
    result = subprocess.run([sys.executable, *GENERATOR, *args, "--check"], capture_output=True, text=True,
                            cwd=ROOT, timeout=COMMAND_SECONDS, check=False)
    if result.returncode != 0:
        failures.append(f"{snippet}\n  the reference generator exited {result.returncode}: "
                        f"{(result.stdout + result.stderr).strip()}")
    return "ran: with --check"


def run_sql(snippet: Snippet, session: Run, failures: list[str]) -> str:
    for prefix, reason in NOT_RUN_SQL.items():
        if snippet.text.startswith(prefix):
            return f"not run: {reason}"
    try:
        with psycopg.connect(session.database(snippet.story), autocommit=True) as conn:
            conn.execute(snippet.text)
    except psycopg.Error as exc:
        failures.append(f"{snippet}\n  {type(exc).__name__}: {exc}")
    return "ran"


def run_program(snippet: Snippet, tokens: list[str], env: dict[str, str], stdin: str | None, session: Run,
                failures: list[str], expected: int = 0) -> subprocess.CompletedProcess[str] | None:
    """`webhook-worker ARGS` as a subprocess with README's arguments; a worker is started, seen
    started, and stopped with SIGTERM, which README says ends it with status 0."""
    args = list(tokens[1:])
    for at, arg in enumerate(args[:-1]):
        if arg == "--url":
            args[at + 1] = session.receiver_url()
        elif arg == "--config" and not (session.workdir / args[at + 1]).exists():
            # README: "a YAML file (see config.example.yaml)"
            (session.workdir / args[at + 1]).write_text((ROOT / "config.example.yaml").read_text())
        elif arg.endswith("-file") and args[at + 1] != "-" and not (session.workdir / args[at + 1]).exists():
            placeholder = session.workdir / f"placeholder-{at}"
            placeholder.write_text(session.placeholder(arg) + "\n")
            args[at + 1] = str(placeholder)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("WEBHOOK_WORKER_") and k != "DATABASE_URL"}
    environment = {**clean, **session.exported, **env, **MACHINE}
    if "DATABASE_URL" in environment:
        environment["DATABASE_URL"] = session.database(snippet.story)
        grant_loopback(args, environment["DATABASE_URL"])
    command = [sys.executable, "-m", "worker", *args]
    if runs(args, cmd_api):
        start_api(snippet, command, environment, session, failures)
        return None
    if is_worker(args):
        run_worker(snippet, command, environment, session, failures)
        return None
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, env=environment,
                            cwd=session.workdir, timeout=COMMAND_SECONDS, check=False)
    if result.returncode != expected:
        failures.append(f"{snippet}\n  ran {shlex.join(args)}: exit {result.returncode}, README expects "
                        f"{expected}\n  stdout: {result.stdout.strip()}\n  stderr: {result.stderr.strip()}")
    return result


def grant_loopback(args: list[str], dsn: str) -> None:
    """An endpoint README registers in a tenant stands on a public host on the reader's machine and
    on loopback here (the session's receiver): the tenant is granted loopback first, as MACHINE
    allows it for the default tenant's (a tenant's endpoints never reach the configuration's list)."""
    if args[:2] != ["endpoints", "add"] or "--tenant" not in args[:-1]:
        return
    tenant = args[args.index("--tenant") + 1]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE webhooks.tenants SET allow_networks = ARRAY(SELECT DISTINCT n FROM"
                     " unnest(allow_networks || '127.0.0.1/32'::cidr) n ORDER BY 1) WHERE name = %s",
                     (tenant,))


def is_worker(args: list[str]) -> bool:
    """Whether these arguments run the worker (which runs until it is stopped)."""
    try:
        return bool(build_parser().parse_args(args).handler is cmd_run)
    except SystemExit:  # a usage error: run it, and its status is reported
        return False


def runs(args: list[str], handler: Callable[[argparse.Namespace], int]) -> bool:
    try:
        return bool(build_parser().parse_args(args).handler is handler)
    except SystemExit:
        return False


def start_api(snippet: Snippet, command: list[str], environment: dict[str, str], session: Run,
              failures: list[str]) -> None:
    """Start `webhook-worker api` and leave it running for the curl commands that follow."""
    stop_api(session, failures)
    log = session.workdir / f"api-{snippet.line}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment,
                                   cwd=session.workdir)
    deadline = time.monotonic() + WORKER_READY_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        for text in log.read_text().splitlines():
            if '"api listening"' in text:
                session.api = (snippet, process, int(json.loads(text)["port"]))
                return
        time.sleep(0.05)
    process.kill()
    process.wait(10)
    failures.append(f"{snippet}\n  the API did not start\n  output: {log.read_text().strip()[-3000:]}")


def stop_api(session: Run, failures: list[str]) -> None:
    if session.api is None:
        return
    snippet, process, _port = session.api
    session.api = None
    process.send_signal(signal.SIGTERM)
    try:
        status = process.wait(COMMAND_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        status = process.wait(10)
    if status != 0:
        failures.append(f"{snippet}\n  the API exited {status} on SIGTERM (README: it runs until SIGTERM)")


def run_curl(snippet: Snippet, words: list[str], session: Run, failures: list[str]) -> str:
    """curl as README writes it, sent to the API README started (its -f turns an HTTP error into a
    non-zero exit)."""
    if session.api is None:
        failures.append(f"{snippet}\n  curl before any `webhook-worker api` started")
        return "ran"
    port = session.api[2]
    args = [w.replace(README_API, f"http://127.0.0.1:{port}") for w in words[1:]]
    result = subprocess.run(["curl", "--max-time", "30", *args], capture_output=True, text=True,
                            timeout=COMMAND_SECONDS, check=False)
    if result.returncode != 0:
        failures.append(f"{snippet}\n  curl exited {result.returncode}\n"
                        f"  stdout: {result.stdout.strip()[:2000]}\n  stderr: {result.stderr.strip()}")
    return "ran"


def run_worker(snippet: Snippet, command: list[str], environment: dict[str, str], session: Run,
               failures: list[str]) -> None:
    log = session.workdir / f"worker-{snippet.line}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment,
                                   cwd=session.workdir)
    try:
        deadline = time.monotonic() + WORKER_READY_SECONDS
        while '"worker started"' not in log.read_text() and process.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        started = '"worker started"' in log.read_text()
        process.send_signal(signal.SIGTERM)
        status = process.wait(COMMAND_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    if not started or status != 0:
        failures.append(f"{snippet}\n  the worker {'started' if started else 'did not start'}, then exited "
                        f"{status} on SIGTERM (README: 0)\n  output: {log.read_text().strip()[-3000:]}")


@pytest.fixture
def session(tmp_path: Path, receiver: Receiver, template_db: str,
            fresh_db: Callable[[bool], str]) -> Iterator[Run]:
    run = Run(receiver, lambda: fresh_db(True), tmp_path)
    yield run
    if run.api is not None:  # a test that failed before stopping it
        run.api[1].kill()
        run.api[1].wait(10)


def test_readme_shows_commands_of_every_kind() -> None:
    found = snippets(README.read_text())
    kinds = {s.kind for s in found}
    assert kinds == {"shell", "sql", "inline"}, kinds
    assert any(s.text.startswith(f"{PROGRAM} endpoints add") for s in found)


def test_the_pages_of_docs_are_read_too() -> None:
    names = {str(path.relative_to(ROOT)) for path in PAGES}
    assert {"docs/reference/cli.md", "docs/reference/http-api.md", "docs/delivery.md"} <= names
    found = [s for path in PAGES[1:] for s in page_snippets(path)]
    assert {s.kind for s in found} == {"shell", "sql", "inline"}
    assert all(s.story == s.page for s in found)  # one database per page of docs/


def test_a_dollar_quoted_body_is_one_statement() -> None:
    body = [(1, "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$"), (2, "BEGIN"),
            (3, "    RETURN 1;  -- one"), (4, "END;"), (5, "$$;"), (6, "SELECT 'a;b';")]
    assert [text for _line, text in sql_statements(body)] == [
        "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END; $$;", "SELECT 'a;b';"]


# Dozens of commands and processes one after another: the per-test hang guard (pyproject's 300 s)
# sized for this much work on a loaded machine.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_command_a_page_shows_runs_as_written(session: Run, page: Path):
    failures: list[str] = []
    handled: dict[Snippet, str] = {}
    started = time.monotonic()
    if page != README:  # where README's "Using it" leaves a reader
        session.exported.update({"DATABASE_URL": "…", KEYS_ENV: TEST_KEYS})
    for snippet in page_snippets(page):
        if snippet.kind == "sql":
            handled[snippet] = run_sql(snippet, session, failures)
        elif snippet.kind == "inline" and synopsis(snippet.text):
            problem = synopsis_problem(snippet.text)
            if problem:
                failures.append(f"{snippet}\n  {problem}")
            handled[snippet] = "checked: a synopsis, its commands and options exist"
        else:
            handled[snippet] = run_shell(snippet, session, failures)
    stop_api(session, failures)
    print(f"\n{len(handled)} snippets of {page.name} in {time.monotonic() - started:.1f} s:")
    for snippet, how in handled.items():
        print(f"  {snippet}\n      {how}")
    assert not failures, "\n\n".join(failures)
    # nothing skipped silently: each was run, checked as a synopsis, or is listed in NOT_RUN
    assert all(how.startswith(("ran", "checked", "not run: ")) for how in handled.values())
    if page == README:
        assert sum(how.startswith("ran") for how in handled.values()) >= 10


@pytest.mark.parametrize(
    ("text", "stdin", "stdin_for"),
    [
        ("webhook-worker endpoints add --name x --url https://… --secret-file - < secret.txt",
         None, "--secret-file"),
        ("printf '%s' \"$SECRET\" | webhook-worker endpoints add --name x --url-file -", None, "--url-file"),
        ("cat keys.txt | webhook-worker keys status --keys-file -", None, "--keys-file"),
        ("webhook-worker endpoints add --name x --secret-file - <<< \"$SECRET\"", None, "--secret-file"),
        ("webhook-worker endpoints add --name x --secret-file -", None, "--secret-file"),
        ("echo '{\"a\": 1}' | webhook-worker enqueue --endpoint x --payload -", '{"a": 1}\n', None),
        ("webhook-worker enqueue --endpoint x --payload - <<< '{\"a\": 1}'", '{"a": 1}\n', None),
        ("webhook-worker migrate   # comment | with < signs", None, None),
    ],
    ids=["file", "printf variable", "cat", "here-string variable", "typed", "echo", "here-string", "none"],
)
def test_standard_input_is_readme_s_text_or_a_placeholder_for_the_option_reading_it(text, stdin, stdin_for):
    line = parse_line(text)
    assert line.words[0] == PROGRAM and "<" not in line.words and "|" not in line.words
    assert (line.stdin, line.stdin_for) == (stdin, stdin_for)


def test_environment_prefixes_are_taken_apart_from_the_command() -> None:
    line = parse_line("DATABASE_URL='postgresql://owner:…@…' WEBHOOK_WORKER_ENCRYPTION_KEYS='…' "
                      "webhook-worker endpoints add --name ops --url https://…")
    assert line.env == {"DATABASE_URL": "postgresql://owner:…@…", KEYS_ENV: "…"}
    assert line.words == [PROGRAM, "endpoints", "add", "--name", "ops", "--url", "https://…"]


def test_a_here_document_is_fed_as_the_text_it_spells_out() -> None:
    body = [(1, "webhook-worker endpoints update x --header-file - <<'EOF'"), (2, "X-A: 1"), (3, "X-B: 2"),
            (4, "EOF"), (5, "webhook-worker status")]
    commands = list(shell_lines(body))
    assert commands == [(1, "webhook-worker endpoints update x --header-file - <<< 'X-A: 1\nX-B: 2'"),
                        (5, "webhook-worker status")]
    assert parse_line(commands[0][1]).stdin == "X-A: 1\nX-B: 2\n"
