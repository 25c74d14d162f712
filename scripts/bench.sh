#!/usr/bin/env bash
# The benchmark: every figure in one run on this machine, printed as a table with each
# target PASS/MISS, and written as JSON under bench/results/. Extra arguments go to bench.run
# (e.g. scripts/bench.sh --quick, or --help).
source "$(dirname "$0")/bootstrap.sh"
.venv/bin/python -m pip install -q -c scripts/constraints-dev.txt -e '.[dev,bench]'
exec .venv/bin/python -m bench.run "$@"
