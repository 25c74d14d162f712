#!/usr/bin/env bash
# The whole check, as CI runs it: lint, types, and every test on a real PostgreSQL.
# Extra arguments go to pytest (e.g. scripts/test.sh -k fencing). Three pytest-xdist processes, each
# with its own throwaway cluster; tests that measure time run one after another in one of them
# (the "serial" group, tests/conftest.py).
source "$(dirname "$0")/bootstrap.sh"
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/pytest -n 3 --dist loadgroup "$@"
