# Sourced by the other scripts: makes .venv with the project and its dev tools installed, and makes
# sure PostgreSQL server binaries exist for the throwaway test cluster.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
.venv/bin/python -m pip install -q -e '.[dev]'

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
