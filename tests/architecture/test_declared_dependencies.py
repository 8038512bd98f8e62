"""Each service installs, imports and starts with only its declared dependencies.

For each service (and for the Connectors SDK, what a Flow author installs) a fresh virtual
environment in ``tmp`` gets the wheels of exactly the first-party packages its pyproject.toml
declares, transitively, and the third-party requirements they declare, pinned by
requirements/constraints.txt (from pip's cache or PyPI). Then the service's main module is
imported there, and the four services are started each from its own environment on SQLite
(docs/decisions/103-package-graph-enforced.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nexuscrm_tools.launcher import ALL_SERVICES, health_status, service_command, start_services, stop_services
from tests.architecture.packages import (
    REPO_ROOT,
    SERVICES,
    Package,
    canonical_name,
    closure,
    load_packages,
    services_named,
    third_party_requirements,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

SDK = "nexuscrm-connectors-sdk"
ENVIRONMENTS = (*SERVICES, SDK)
SPEC_OF = {
    "nexuscrm-schema-catalog": "schema-catalog",
    "nexuscrm-controlplane": "controlplane",
    "nexuscrm-connectors": "connectors",
    "nexuscrm-integration": "integration",
}
# What "a SQL driver of another owner's" means for the Integration host: the packages through
# which one reaches the canonical tables or another database than the host's own. The host
# keeps SQLAlchemy (declared: its Flows' read models) and PyMySQL (through nexuscrm-runtime,
# whose create_engine speaks the MySQL protocol to the host's own read-model database); it
# must not carry the schema catalog's table definitions (nexuscrm-schema) or migrations
# (alembic), nor any other database driver.
SQL_DISTRIBUTIONS = {
    "sqlalchemy",
    "pymysql",
    "alembic",
    "nexuscrm-schema",
    "mysqlclient",
    "mysql-connector-python",
    "psycopg",
    "psycopg-binary",
    "psycopg2",
    "psycopg2-binary",
    "asyncpg",
    "aiomysql",
    "aiosqlite",
}
INTEGRATION_SQL = {"sqlalchemy", "pymysql"}
OTHER_OWNERS_OF_INTEGRATION = {"nexuscrm-connectors", "nexuscrm-controlplane", "nexuscrm-schema-catalog"}
PIP_TIMEOUT = 600  # seconds for one pip command (a cold cache downloads from PyPI)

# Run with -I in an environment: what is installed, and whether importing ``module`` works
# and which first-party top-level packages it pulled in.
PROBE = """
import importlib, importlib.metadata, importlib.util, json, pkgutil, re, sys
module, others = sys.argv[1], sys.argv[2:]
report = {"distributions": sorted({re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower()
                                   for d in importlib.metadata.distributions()})}
try:
    imported = importlib.import_module(module)
    if hasattr(imported, "__path__"):  # a library: every module of it
        for info in pkgutil.walk_packages(imported.__path__, module + "."):
            importlib.import_module(info.name)
    report["error"] = None
except Exception as error:
    report["error"] = f"{type(error).__name__}: {error}"
tops = {m.split(".")[0] for m in sys.modules}
report["first_party_loaded"] = sorted(t for t in tops if t.startswith(("nexuscrm", "workqueue")))
report["importable_others"] = [o for o in others if importlib.util.find_spec(o) is not None]
print(json.dumps(report))
"""


def run(command: list[str], *, timeout: float = PIP_TIMEOUT) -> str:
    """Run a command; on failure, fail the test with its output."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def python_of(venv: Path) -> str:
    """The interpreter of a virtual environment."""
    return str(venv / "bin" / "python")


@pytest.fixture(scope="module")
def packages() -> dict[str, Package]:
    return load_packages()


@pytest.fixture(scope="module")
def wheels(packages: dict[str, Package], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One wheel per package, built from a copy so that the tree gets no build/ folders."""
    root = tmp_path_factory.mktemp("wheels")
    sources = []
    for package in packages.values():
        copy = root / "src" / package.name
        shutil.copytree(
            package.directory,
            copy,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist"),
        )
        sources.append(str(copy))
    out = root / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), *sources]
    )
    built = {}
    for wheel in out.glob("*.whl"):
        built[canonical_name(wheel.name.split("-")[0])] = wheel
    assert set(built) == set(packages), sorted(built)
    return built


@pytest.fixture(scope="module")
def environments(
    packages: dict[str, Package], wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """A virtual environment per service and for the SDK, with only the declared closure."""
    root = tmp_path_factory.mktemp("venvs")
    made = {}
    for name in ENVIRONMENTS:
        venv = root / name
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
        pip = [sys.executable, "-m", "pip", "--python", python_of(venv), "install", "--quiet"]
        first_party = closure(packages, name)
        run([*pip, "--no-deps", "--no-index", *(str(wheels[n]) for n in first_party)])
        requirements = third_party_requirements(packages, first_party)
        if requirements:
            run([*pip, "-c", str(REPO_ROOT / "requirements" / "constraints.txt"), *requirements])
        made[name] = venv
    return made


def probe(venv: Path, module: str, others: list[str]) -> dict[str, Any]:
    """What ``PROBE`` reports in ``venv`` (isolated mode: no user site, no PYTHONPATH, no cwd)."""
    report: dict[str, Any] = json.loads(run([python_of(venv), "-I", "-c", PROBE, module, *others], timeout=120))
    return report


def test_no_service_declares_another_service(packages: dict[str, Package]) -> None:
    for name in SERVICES:
        declared = packages[name].first_party
        print(f"{name}: declares {', '.join(packages[name].requires)}")
        assert not set(declared) & set(SERVICES), f"{name} declares another service: {declared}"
        assert services_named(packages, name) == [], name


def test_integration_host_declares_no_other_owner_nor_its_sql(packages: dict[str, Package]) -> None:
    first_party = closure(packages, "nexuscrm-integration")
    assert not set(first_party) & (OTHER_OWNERS_OF_INTEGRATION | {"nexuscrm-schema"}), first_party
    third_party = {canonical_name(r) for r in third_party_requirements(packages, first_party)}
    assert third_party & SQL_DISTRIBUTIONS == INTEGRATION_SQL, third_party & SQL_DISTRIBUTIONS
    # PyMySQL is the runtime's (its engines speak the MySQL protocol), not declared by the host.
    assert "pymysql" not in {canonical_name(r) for r in packages["nexuscrm-integration"].third_party}
    assert "pymysql" in {canonical_name(r) for r in packages["nexuscrm-runtime"].third_party}


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_each_package_imports_with_only_its_declared_dependencies(
    name: str, packages: dict[str, Package], environments: dict[str, Path]
) -> None:
    first_party = closure(packages, name)
    module = f"{packages[name].modules[0]}.main" if name in SERVICES else packages[name].modules[0]
    others = [m for n, p in packages.items() if n not in first_party for m in p.modules]
    report = probe(environments[name], module, others)
    assert report["error"] is None, f"{name} does not import with only {first_party}: {report['error']}"
    installed = set(report["distributions"])
    assert {n for n in installed if n.startswith("nexuscrm-")} == set(first_party), installed
    assert report["importable_others"] == [], report
    loaded = set(report["first_party_loaded"])
    assert loaded <= {m for n in first_party for m in packages[n].modules}, loaded
    if name == "nexuscrm-integration":
        assert not installed & (OTHER_OWNERS_OF_INTEGRATION | {"nexuscrm-tools"}), installed
        assert installed & SQL_DISTRIBUTIONS == INTEGRATION_SQL, installed & SQL_DISTRIBUTIONS
    if name == SDK:  # what a Flow author installs: no runtime, no SQL stack
        assert not installed & (SQL_DISTRIBUTIONS | {"nexuscrm-runtime"}), installed


def test_four_services_start_each_from_its_own_environment(environments: dict[str, Path], tmp_path: Path) -> None:
    interpreters = {SPEC_OF[name]: python_of(environments[name]) for name in SERVICES}
    started = time.monotonic()
    services = start_services(
        ALL_SERVICES,
        env={"NEXUSCRM_DSN": f"sqlite:///{tmp_path / 'nexuscrm.db'}", "PYTHONNOUSERSITE": "1", "PYTHONPATH": ""},
        workdir=tmp_path / "run",
        interpreters=interpreters,
    )
    try:
        for service in services:
            assert service.process.args == service_command(interpreters[service.spec.name], service.spec.module)
            assert health_status(service.address, service.spec.service_name) == "SERVING"
    finally:
        codes = stop_services(services)
    assert codes == {spec.name: 0 for spec in ALL_SERVICES}
    print(f"four services started from their own environments and stopped in {time.monotonic() - started:.1f}s")
