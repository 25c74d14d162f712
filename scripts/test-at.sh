#!/usr/bin/env bash
# The whole check (scripts/test.sh) with the clock moved: the tests and the PostgreSQL they start see
# the given UTC time as now, and time runs on from there, so a run started a few minutes before a
# midnight or a month end crosses it. Nothing may depend on the day a test runs (audit-log partitions,
# retention windows, fixtures dumped on one day).
#   bash scripts/test-at.sh '2027-02-28 23:55:00'          # then scripts/test.sh's own arguments
# Needs libfaketime (Debian: faketime; installed with apt-get when run as root). With DATABASE_URL set
# the server's clock is not moved, so the throwaway clusters are used whatever the environment says.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: bash scripts/test-at.sh 'YYYY-MM-DD HH:MM:SS' [pytest arguments]" >&2
    exit 2
fi
start=$(date -u -d "$1 UTC" +%s) || { echo "not a time: $1" >&2; exit 2; }
shift
if ! command -v faketime >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null
    else
        echo "faketime not found: install it (Debian: apt-get install faketime)" >&2
        exit 1
    fi
fi
offset=$(( start - $(date -u +%s) ))
unset DATABASE_URL
# An offset, not a fixed time: the clock keeps running, so timeouts and deadlines behave as usual.
if [ "$offset" -ge 0 ]; then offset="+$offset"; fi
exec faketime -f "${offset}s" bash scripts/test.sh "$@"
