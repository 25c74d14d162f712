#!/usr/bin/env bash
# The whole check, as CI runs it: lint, types, and every test on a real PostgreSQL.
# Extra arguments go to pytest (e.g. scripts/test.sh -k fencing).
source "$(dirname "$0")/bootstrap.sh"
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/pytest "$@"
