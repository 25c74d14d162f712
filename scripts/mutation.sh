#!/usr/bin/env bash
# Mutation testing of the pure decision modules: mutmut plants small bugs in one module
# at a time and runs the unit tests that cover it; a mutant no test notices is a gap in the suite.
# Not part of scripts/test.sh: it takes minutes per module. Run it by hand:
#   scripts/mutation.sh                  # every module below, one after another
#   scripts/mutation.sh policy signing   # some of them
# Each module runs in a copy of the tree under $MUTATION_DIR (default: a new temporary directory),
# so the checkout is never changed; mutmut's results stay there (`mutmut results`, `mutmut show
# NAME` inside <dir>/<module>). The SQL functions have hand-made mutants: scripts/sql_mutants.py.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
if [[ ! -x .venv/bin/mutmut ]]; then
    .venv/bin/python -m pip install -q -c scripts/constraints-dev.txt -e '.[dev,mutation]'
fi
# The unit tests that exercise each module (directly, or through the module that calls it).
declare -A TESTS=(
    [classification]="tests/unit/test_classification.py tests/unit/test_outcomes.py tests/unit/test_delivery.py"
    [signing]="tests/unit/test_signing.py tests/unit/test_delivery.py"
    [encryption]="tests/unit/test_encryption.py tests/unit/test_delivery.py"
    [destinations]="tests/unit/test_destinations.py tests/unit/test_delivery.py"
    [outcomes]="tests/unit/test_outcomes.py"
    [coalescing]="tests/unit/test_coalescing.py"
    [registration]="tests/unit/test_registration.py"
)
# Where each module is, under worker/.
declare -A PATHS=(
    [classification]=rules/classification [signing]=rules/signing [encryption]=encryption [destinations]=rules/destinations
    [outcomes]=daemon/outcomes [coalescing]=rules/coalescing [registration]=rules/registration
)
modules=("$@")
[[ ${#modules[@]} -gt 0 ]] || modules=(classification signing encryption destinations outcomes coalescing registration)
base=${MUTATION_DIR:-$(mktemp -d -t mutation.XXXXXX)}
summary=()
for module in "${modules[@]}"; do
    tests=${TESTS[$module]:?"no tests listed for module $module (scripts/mutation.sh, TESTS)"}
    dir="$base/$module"
    rm -rf "$dir" && mkdir -p "$dir"
    git ls-files -z worker tests sql pyproject.toml README.md | xargs -0 cp --parents -t "$dir"
    {
        echo "[mutmut]"
        echo "source_paths=worker"
        echo "only_mutate=worker/${PATHS[$module]}.py"
        echo "pytest_add_cli_args_test_selection=${tests// /$'\n    '}"
        echo "also_copy=tests"
        echo "    sql"
        echo "    pyproject.toml"
        echo "    README.md"
        echo "track_dependencies=false"
    } > "$dir/setup.cfg"
    echo "== $module ($tests) in $dir"
    # one process: the machine is shared (2 cores); bounded, so a stuck mutant cannot hang the run
    (cd "$dir" && timeout 1800 "$root/.venv/bin/mutmut" run --max-children 1 > run.log 2>&1) \
        || echo "mutmut run for $module ended with $? (see $dir/run.log)"
    (cd "$dir" && "$root/.venv/bin/mutmut" export-cicd-stats > /dev/null 2>&1 \
        && "$root/.venv/bin/mutmut" results > survivors.txt 2>&1) || true
    stats="$dir/mutants/mutmut-cicd-stats.json"
    if [[ -f $stats ]]; then
        line=$("$root/.venv/bin/python" - "$module" "$stats" <<'EOF'
import json, sys
module, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))
print(f"{module}: " + ", ".join(f"{k} {s[k]}" for k in
      ("total", "killed", "survived", "timeout", "no_tests", "suspicious", "skipped") if k in s))
EOF
)
        summary+=("$line")
        echo "$line"
        grep -v '^\s*$' "$dir/survivors.txt" | sed 's/^/    /' || true
    fi
done
echo
echo "== summary (results in $base)"
printf '%s\n' "${summary[@]}"
