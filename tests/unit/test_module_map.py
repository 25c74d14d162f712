"""The module map holds (docs/design.md): no import circles, the HTTP side apart from the database,
and the operator's connections opened in one place. Read from the source, without importing it."""

import ast
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


@pytest.mark.parametrize("side", ["worker.delivery", "worker.attempt"])
def test_the_http_side_and_the_attempt_do_not_import_the_database_side_or_the_loop(side):
    """Data flows one way, claim → attempt → finish: the attempt is handed its rows and hands its
    outcomes on, and knows neither the claim nor the writing of outcomes."""
    reached, todo = set(), [side]
    graph = imports()
    while todo:
        for module in graph[todo.pop()] - reached:
            reached.add(module)
            todo.append(module)
    assert not reached & {"worker.store.queue", "worker.operator_sql", "worker.schema", "worker.daemon",
                          "worker.finisher", "worker.liveness"}


def test_encryption_does_not_import_the_configuration():
    assert "worker.config" not in imports()["worker.encryption"]


def test_only_the_database_modules_open_connections():
    opening = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "connect" and "psycopg" in ast.unparse(node.func.value)):
                opening.add(path.stem)
    # queue: the worker's pool and its own connections; operator_sql: the CLI's and the demo's;
    # schema: the migration runner; localpg: the throwaway cluster of the demo and the tests;
    # the API's own pool is in api/database; its endpoint writes go through operator_sql, as the CLI's do.
    assert opening == {"queue", "operator_sql", "schema", "localpg"}


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
