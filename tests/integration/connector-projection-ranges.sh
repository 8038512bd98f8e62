#!/usr/bin/env bash
# The one test runner, locally and in CI (the release gate runs exactly this).
#
#   bash tests/integration/connector-projection-ranges.sh [pytest arguments]
#
# Builds the virtualenv if needed, checks that the owners' checkouts fit each other's version
# ranges (exit 9 when not), then runs buf lint, ruff, lint-imports, mypy and pytest. Database tests
# run on SQLite and, with NEXUSCRM_TIDB_DSN set, on that MySQL-protocol server;
# NEXUSCRM_TIDB_REQUIRED=1 makes a missing server a failure instead of a skip.
#
# Each owner can come from another checkout: NEXUSCRM_REPO_ROOT (Core), NEXUSCRM_CONTROLPLANE_ROOT,
# NEXUSCRM_CONNECTORS_ROOT, NEXUSCRM_INTEGRATION_ROOT (owners.toml), each defaulting to this one.
# When one names another checkout, the tests run in an external temporary virtualenv with each
# owner's packages installed from its checkout, each owner's tests from there (tests/harness);
# NEXUSCRM_KEEP_VENV=1 keeps that virtualenv. Lint and mypy check this checkout only.
set -uo pipefail
cd "$(dirname "$0")/../.."

step() { printf '\n== %s\n' "$*"; }

step "setup"
make --no-print-directory setup || exit 1
BIN=.venv/bin

step "checkouts and version ranges"
"$BIN/python" -m tests.harness check || exit $?

step "buf lint"
"$BIN/buf" lint || exit 1
step "buf breaking (the contract against the previous release: protos/CHANGELOG.md)"
make --no-print-directory breaking || exit 1
step "ruff"
"$BIN/ruff" check . && "$BIN/ruff" format --check . || exit 1
step "lint-imports (the package graph: docs/decisions/103-package-graph-enforced.md)"
"$BIN/lint-imports" || exit 1
step "mypy"
"$BIN/mypy" libs services tools tests bench examples docs/hooks protos/generate.py || exit 1

step "pytest"
exec "$BIN/python" -m tests.harness test "$@"
