# The two commands of a fresh machine are `make run` and `make test`; each does its own set-up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PACKAGES := protos/python libs/workqueue libs/runtime libs/schema libs/connectors_sdk services/schema_catalog services/controlplane services/connectors services/integration tools
STAMP := $(VENV)/.setup-stamp
# The Core checkout whose canonical schema the database tests apply (required by them): this one
# unless the environment names another.
export NEXUSCRM_REPO_ROOT ?= $(CURDIR)
RUNTIME_STAMP := $(VENV)/.runtime-stamp
# pip quiet, and without setuptools' "Editable installation" notice (one per editable package,
# a dozen lines each): only that warning is ignored, every error still prints.
PIP := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet
PROTOS := $(shell find protos/nexuscrm -name '*.proto')
PYPROJECTS := $(addsuffix /pyproject.toml,$(PACKAGES))

.PHONY: setup runtime protos test test-some run lint typecheck fmt clean bench bench-quick reliability soak versions-demo deps test-owner breaking docs

# runtime: what running needs (every package editable, the protos generated); setup adds the
# development and test tools of requirements/dev.txt.
runtime: $(RUNTIME_STAMP)
setup: $(STAMP)

$(RUNTIME_STAMP): requirements/constraints.txt $(PYPROJECTS) $(PROTOS) protos/generate.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -c requirements/constraints.txt grpcio-tools protobuf
	$(BIN)/python protos/generate.py > /dev/null
	$(PIP) -c requirements/constraints.txt $(addprefix -e ,$(PACKAGES))
	touch $@

$(STAMP): $(RUNTIME_STAMP) requirements/dev.txt
	$(PIP) -c requirements/constraints.txt -r requirements/dev.txt
	touch $@

protos: setup
	$(BIN)/python protos/generate.py

test: setup
	bash tests/integration/connector-projection-ranges.sh

# A chosen part of the suite with what `make test` sets (NEXUSCRM_REPO_ROOT; without
# NEXUSCRM_TIDB_DSN the database tests start a private MariaDB server, as they do there), but
# none of its lint and type checks: make test-some ARGS="tests/connectors -k replay".
test-some: setup
	$(if $(strip $(ARGS)),,@echo 'make test-some needs ARGS, the pytest arguments: ARGS="tests/connectors -k replay"' >&2; exit 2)
	$(BIN)/python -m pytest $(ARGS)

# The long reliability suite: crash points, stale workers, 10 000 fuzz cases per service,
# database faults, and five seeded fault histories of 1 000 receipts each; the figures of the
# run go to var/reliability-figures.jsonl (see docs/reliability.md).
reliability: setup
	rm -f var/reliability-figures.jsonl
	NEXUSCRM_FUZZ_CASES_PER_SERVICE=10000 NEXUSCRM_RELIABILITY_FULL=1 \
	NEXUSCRM_RELIABILITY_FIGURES=var/reliability-figures.jsonl $(BIN)/pytest tests/connectors/reliability tests/system/reliability

# The soak (tests/system/soak/run.py, decision 182): half the measured maximum rate for
# SOAK_MINUTES (an hour by default) with retention, duplicates, failures, replays and a rolling
# restart every sixth of the run; fails when a sampled resource's fitted slope exceeds its
# allowance. SOAK_BACKEND=sqlite for the embedded backend; figures in var/soak-figures.jsonl.
SOAK_MINUTES ?= 60
SOAK_BACKEND ?= mariadb
soak: setup
	$(BIN)/python -m tests.system.soak.run --minutes $(SOAK_MINUTES) --backend $(SOAK_BACKEND) --figures var/soak-figures.jsonl

# Issue 52's scenario at scale: a Flow version built over 10^5 retained inputs while ingest
# goes on (duplicates, a failing input), Connectors and the build's worker SIGKILLed mid-way,
# then switch, rollback, switch again and retire, on SQLite and MariaDB
# (tests/system/reliability/test_flow_version_restarts.py; CI runs it at 3 000 inputs).
VERSIONS_DEMO_INPUTS ?= 100000
versions-demo: setup
	NEXUSCRM_VERSION_DEMO_INPUTS=$(VERSIONS_DEMO_INPUTS) $(BIN)/pytest -p no:cacheprovider \
	  tests/system/reliability/test_flow_version_restarts.py

# The whole N-1 compatibility tier (docs/decisions/147-n-1-compatibility-tier.md): each owner's
# previous release (owners.toml) built from its commit into a virtualenv of its own, run against
# the current others on the real MariaDB. `make test` runs only its smoke set. Builds go to a
# temporary directory, or to NEXUSCRM_COMPAT_CACHE=<dir outside the checkout> to keep them.
.PHONY: compat
compat: setup
	NEXUSCRM_COMPAT_FULL=1 $(BIN)/pytest tests/compatibility

# One owner's suite in a virtualenv of only Core and that owner, outside the checkout
# (decision 146): make test-owner OWNER=connectors (schema-catalog, controlplane, integration).
OWNER ?= connectors
test-owner: setup
	$(BIN)/python -m tests.harness owner $(OWNER)

# Extra flags for nexuscrm-run, e.g. make run ARGS="--serve" or ARGS="--lanes 50 --inputs 1000".
ARGS ?=

# GNU make exits 2 whenever a recipe fails, whatever its code, after its own "Error N" line: the
# line before it says the runner's code, and `make runtime && .venv/bin/nexuscrm-run ...`
# returns it (decision 113). Ctrl-C reaches make too: after the runner's summary and that line,
# make ends by the signal itself (130 in the shell), not with 2.
run: runtime
	@$(BIN)/nexuscrm-run $(ARGS); code=$$?; \
	if [ $$code -eq 130 ]; then echo "nexuscrm-run was interrupted (exit 130; docs: exit codes)" >&2; \
	elif [ $$code -ne 0 ]; then echo "nexuscrm-run exited with $$code (docs: exit codes); make reports it as Error $$code and exits 2" >&2; fi; \
	exit $$code

# Benchmarks, separate from the tests (docs/performance.md). QUICK=1 or bench-quick: the short run.
bench: setup
	$(BIN)/python -m bench $(if $(QUICK),--quick)

bench-quick: setup
	$(BIN)/python -m bench --quick

# The documentation site (docs/decisions/186-documentation-site.md), warnings as errors, into
# var/site/: open var/site/index.html. The reference pages are generated now, from the code.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

lint: setup
	$(BIN)/buf lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# The contract against the previous release's (owners.toml, the schema-catalog owner's commit):
# fails on any change `buf breaking` refuses; those go to a new proto package, v2
# (protos/CHANGELOG.md, docs/decisions/143-owners-versions-and-ranges.md).
breaking: setup
	@commit=$$($(BIN)/python -c 'import tomllib; print(tomllib.load(open("owners.toml", "rb"))["owners"]["schema-catalog"]["previous"]["commit"])') && \
	echo "buf breaking: protos against the previous release, commit $$commit" && \
	$(BIN)/buf breaking --against ".git#ref=$$commit"

# Each package's declared dependencies and what a deployment of it installs; fails when a
# service names another service (docs/decisions/103-package-graph-enforced.md).
deps: setup
	$(BIN)/python -m tests.architecture.packages

typecheck: setup
	$(BIN)/mypy libs services tools tests bench examples docs/hooks protos/generate.py protos/python/nexuscrm_wire

fmt: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) protos/python/nexuscrm var
