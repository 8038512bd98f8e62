#!/usr/bin/env bash
# The one test runner, locally and in CI (the release gate runs exactly this).
#
#   bash tests/integration/connector-projection-ranges.sh [pytest arguments]
#
# Builds the virtualenv if needed, then runs buf lint, ruff, lint-imports, mypy and pytest. Database tests
# run on SQLite and, with NEXUSCRM_TIDB_DSN set, on that MySQL-protocol server;
# NEXUSCRM_TIDB_REQUIRED=1 makes a missing server a failure instead of a skip.
set -uo pipefail
cd "$(dirname "$0")/../.."

step() { printf '\n== %s\n' "$*"; }

step "setup"
make --no-print-directory setup || exit 1
BIN=.venv/bin

step "buf lint"
"$BIN/buf" lint || exit 1
step "ruff"
"$BIN/ruff" check . && "$BIN/ruff" format --check . || exit 1
step "lint-imports (the package graph: docs/decisions/103-package-graph-enforced.md)"
"$BIN/lint-imports" || exit 1
step "mypy"
"$BIN/mypy" libs services tools tests bench examples protos/generate.py || exit 1

step "pytest"
"$BIN/pytest" "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here, not a pass" >&2
  exit 1
fi
exit "$status"
