#!/usr/bin/env bash
# Installs the project and delivers sample alerts end to end: a throwaway PostgreSQL (unless
# DATABASE_URL is set), migrations, a receiver on 127.0.0.1, the worker, and the audit rows.
source "$(dirname "$0")/bootstrap.sh"
exec .venv/bin/webhook-worker demo "$@"
