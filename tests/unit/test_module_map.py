"""The module map holds (docs/design.md): no import circles, the HTTP side apart from the database,
one door to the database (worker/store/: only it opens connections and runs SQL), and the API and
the console apart. Read from the source, without importing it."""

import ast
import re
from pathlib import Path

import pytest

import bench
import worker

PACKAGE = Path(worker.__file__).parent


def module_name(path: Path) -> str:
    """worker/api/app.py -> worker.api.app; a package's __init__.py is the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each worker module's imports of other worker modules (subpackages included), function-level
    and TYPE_CHECKING imports included: an import deferred to hide a circle is still a circle."""
    modules = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("worker"):
                module = node.module or ""
                # `from worker.api import routes` imports the module worker.api.routes
                for alias in node.names:
                    found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("worker.")}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_the_map_reads_the_subpackages():
    graph = imports()
    assert {"worker.api.app", "worker.api.routes", "worker.console.pages"} <= set(graph)
    assert "worker.api.routes" in graph["worker.api.app"]


def test_no_module_imports_itself_through_others():
    graph = imports()

    def reaches(start: str, target: str) -> list[str] | None:
        stack, seen = [[start]], set()
        while stack:
            path = stack.pop()
            for nxt in sorted(graph.get(path[-1], ())):
                if nxt == target:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None

    circles = [circle for module in graph if (circle := reaches(module, module))]
    assert circles == []


@pytest.mark.parametrize("side", ["worker.daemon.sender", "worker.daemon.attempt"])
def test_the_http_side_and_the_attempt_do_not_import_the_database_side_or_the_loop(side):
    """Data flows one way, claim → attempt → finish: the attempt is handed its rows and hands its
    outcomes on, and knows neither the claim nor the writing of outcomes."""
    reached, todo = set(), [side]
    graph = imports()
    while todo:
        for module in graph[todo.pop()] - reached:
            reached.add(module)
            todo.append(module)
    assert not {m for m in reached if m.startswith("worker.store")}
    assert not reached & {"worker.schema", "worker.daemon.worker", "worker.daemon.finisher",
                          "worker.daemon.liveness"}


def test_encryption_does_not_import_the_configuration():
    assert "worker.config" not in imports()["worker.encryption"]


# Besides the store: the migration runner and the throwaway cluster of the demo and the tests.
SQL_OUTSIDE_THE_STORE = {"worker.schema", "worker.localpg"}
# What speaks to PostgreSQL: a statement run, a cursor, COPY, a pipeline, a connection or a pool made.
SPEAKING = {"execute", "executemany", "cursor", "copy", "stream", "pipeline", "fetchone", "fetchall"}


def sql_calls(path: Path) -> list[str]:
    """Where a module runs SQL or opens a connection: `name@line` for each such call."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        opens = name in ("AsyncConnectionPool", "ConnectionPool") \
            or (name == "connect" and "psycopg" in ast.unparse(func))
        if name in SPEAKING or opens:
            found.append(f"{name}@{node.lineno}")
    return found


def test_the_scan_finds_sql_where_it_is():
    assert sql_calls(PACKAGE / "store" / "queue.py")
    assert sql_calls(PACKAGE / "store" / "database.py")


def test_only_the_store_opens_connections_and_runs_sql():
    outside = {name: calls for name, path in ((module_name(p), p) for p in sorted(PACKAGE.rglob("*.py")))
               if not name.startswith("worker.store") and name not in SQL_OUTSIDE_THE_STORE
               and (calls := sql_calls(path))}
    assert outside == {}


def test_the_api_and_the_console_do_not_import_each_other():
    """Not even deferred or through importlib: what both need is in the modules both import, and the
    `api` command mounts the console."""
    graph = imports()

    def side(module: str) -> str:
        return [*module.split("."), ""][1]

    crossing = {(a, b) for a, found in graph.items() for b in found
                if {side(a), side(b)} == {"api", "console"}}
    assert crossing == set()
    for path in [*(PACKAGE / "api").rglob("*.py"), *(PACKAGE / "console").rglob("*.py")]:
        assert "importlib" not in path.read_text(), path


# The package by role (docs/design.md, the map of modules): pure decisions (rules), the one door to
# the database (store), the worker process (daemon), what the HTTP API and the console share (web),
# and the adapters (api, console, cli). Every layer may use the shared modules at the root.
SHARED = {"worker", "worker.config", "worker.errors", "worker.encryption", "worker.observability",
          "worker.runtime", "worker.names", "worker.schema", "worker.localpg", "worker.tables"}
# What each layer may import besides itself. Rules know settings and the configuration error only;
# the store knows rules and sealing; nothing but the cli (whose `api` command mounts the console)
# imports an adapter, and the API and the console never each other.
MAY_IMPORT = {
    "rules": {"worker.config", "worker.errors"},
    "store": {"rules", "worker.encryption", "worker.errors"},
    "daemon": {"rules", "store", *SHARED},
    "web": {"rules", "store", *SHARED},
    "api": {"rules", "store", "web", *SHARED},
    "console": {"rules", "store", "web", *SHARED},
    "cli": {"rules", "store", "daemon", "web", "api", "console", *SHARED},
}
# Libraries that do I/O, which no rule imports (a rule gets what it needs handed to it).
IO_LIBRARIES = {"aiohttp", "asyncio", "psycopg", "psycopg_pool", "subprocess", "multiprocessing", "ssl",
                "http", "urllib.request", "requests", "yaml"}
NETWORK_CALLS = {"getaddrinfo", "gethostbyname", "create_connection", "urlopen"}


def layer(module: str) -> str:
    """The layer a module belongs to: its subpackage, or the module itself at the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in MAY_IMPORT else module


def test_each_layer_imports_only_what_it_may():
    graph = imports()
    assert {layer(m) for m in graph} >= set(MAY_IMPORT)  # every layer is there
    crossing = sorted(f"{module} -> {found}" for module, imports_of in graph.items() for found in imports_of
                      if (own := layer(module)) in MAY_IMPORT and layer(found) != own
                      and layer(found) not in MAY_IMPORT[own] and found not in MAY_IMPORT[own])
    assert crossing == []
    # the shared modules use no adapter, no worker process and no shared state of the web side
    assert sorted(f"{m} -> {f}" for m in SHARED & set(graph) for f in graph[m]
                  if layer(f) in {"store", "daemon", "web", "api", "console", "cli"}
                  and m != "worker.__main__") == []


def test_the_rules_do_no_io():
    found = []
    for path in sorted((PACKAGE / "rules").rglob("*.py")):
        tree = ast.parse(path.read_text())
        type_checking = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                         and ast.unparse(node.test) == "TYPE_CHECKING" for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in type_checking:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            found += [f"{path.name}: import {n}" for n in names
                      if n in IO_LIBRARIES or n.split(".")[0] in IO_LIBRARIES - {"urllib"}]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in NETWORK_CALLS:
                found.append(f"{path.name}: {ast.unparse(node.func)}()")
    assert found == []


ROOT = PACKAGE.parent
DESIGN = ROOT / "docs" / "design.md"
# The pages that name modules by path.
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "sql" / "README.md",
         *sorted((ROOT / "docs").rglob("*.md"))]


def mapped_modules() -> set[str]:
    """The modules docs/design.md's map of modules has a row for."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text[text.index("### The map of modules"):]
    section = section[:section.index("\n### ", 1)]
    return set(re.findall(r"^\| `(worker/[\w/]+\.py)` \|", section, re.MULTILINE))


def test_the_design_maps_every_module_and_only_modules_that_exist():
    modules = {str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}
    mapped = mapped_modules()
    assert len(mapped) > 50  # the scan reads the tables
    assert sorted(modules - mapped) == [], "a module without its row in docs/design.md's map of modules"
    assert sorted(mapped - modules) == [], "a row of docs/design.md's map of modules for no module"


def missing_module(dotted: str) -> bool:
    """Whether `worker.a.b…` (a module and what it holds) names no module: `a` is neither a module
    nor a package, or a package without `b`. Two-part names are configuration keys (worker.id)."""
    parts = dotted.split(".")
    if len(parts) < 3:
        return False
    package = PACKAGE / parts[1]
    if package.is_dir():
        return not ((package / f"{parts[2]}.py").is_file() or (package / parts[2]).is_dir())
    return not package.with_suffix(".py").is_file()


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_module_a_page_names_exists(page: Path):
    text = page.read_text(encoding="utf-8")
    named = set(re.findall(r"\bworker/[\w/]+\.py\b", text))
    assert sorted(name for name in named if not (ROOT / name).is_file()) == []
    dotted = set(re.findall(r"(?<![\w./-])worker(?:\.[a-z_]+)+", text))
    assert sorted(name for name in dotted if missing_module(name)) == []


BENCH = Path(bench.__file__).parent


def bench_imports() -> dict[str, set[str]]:
    """Each bench module's imports of other bench modules (subpackages too, function-level and
    TYPE_CHECKING imports included), and of anything under `tests` (as "tests…")."""
    def module_of(path: Path) -> str:
        return ".".join(("bench", *path.relative_to(BENCH).with_suffix("").parts)).removesuffix(".__init__")

    modules = {module_of(path): path for path in sorted(BENCH.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {m for m in found if m in modules or m == "tests" or m.startswith("tests.")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each module's shortest-found path back to itself through the modules it imports."""
    def reaches(start: str) -> list[str] | None:
        stack, seen = [[start]], set()
        while stack:
            path = stack.pop()
            for nxt in sorted(graph.get(path[-1], ())):
                if nxt == start:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None

    return [circle for module in graph if (circle := reaches(module))]


def test_the_benchmark_has_no_import_circles_and_does_not_import_the_tests():
    graph = bench_imports()
    assert "bench.sections.e2e" in graph  # the scan reaches the subpackage
    assert circles(graph) == []
    assert {module: sorted(m for m in found if m.split(".")[0] == "tests")
            for module, found in graph.items() if any(m.split(".")[0] == "tests" for m in found)} == {}
