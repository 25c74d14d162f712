# Sourced by the other scripts: makes .venv with the project and its dev tools installed, and makes
# sure PostgreSQL server binaries exist for the throwaway test cluster.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ ! -x .venv/bin/python ]; then
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "Python 3.11 or newer is needed as python3 (found: $(python3 --version 2>&1))" >&2
        exit 1
    fi
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
        echo "python3 lacks the venv module with ensurepip: install it (Debian: apt-get install python3-venv)" >&2
        exit 1
    fi
    python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
# The tools are pinned (scripts/constraints-dev.txt); the project's own dependencies are not.
.venv/bin/python -m pip install -q -c scripts/constraints-dev.txt -e '.[dev]'

if [ -z "${DATABASE_URL:-}" ] && ! command -v initdb >/dev/null \
        && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "PostgreSQL server binaries not found; installing them with apt-get" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "PostgreSQL server binaries (initdb, pg_ctl) not found: install them or set DATABASE_URL" >&2
        exit 1
    fi
fi
# The console's browser test drives the system's chromium (Playwright's own download is not used).
if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "chromium not found; installing it with apt-get (the console's browser test needs it)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "chromium not found: the console's browser test (tests/api/test_console_browser.py) will fail;" \
             "install it (Debian: apt-get install chromium)" >&2
    fi
fi
