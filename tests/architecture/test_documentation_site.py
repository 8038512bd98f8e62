"""The documentation site builds with warnings as errors, and its generated reference is complete.

``make test`` builds the site here (``mkdocs build --strict``, as ``make docs`` does), so CI
builds it on every run; a planted page that names a missing flag fails the build. The
reference pages list everything the code and the contract define: every RPC, message, field
and enum value; every command's every flag; every name the SDK exports; every exit code and
every metric.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nexuscrm_sdk
from docs.hooks import commands_reference, grpc_reference, sdk_reference, tables_reference
from nexuscrm_runtime.exit_codes import ExitCode
from tests.architecture.packages import REPO_ROOT

BUILD_TIMEOUT = 180  # seconds; the build takes about ten on an idle machine


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir", str(site)],
        cwd=REPO_ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    done = build(REPO_ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    for page in (
        "index.html",
        "tutorial/first-run.html",
        "reference/grpc.html",
        "reference/cli.html",
        "reference/sdk.html",
    ):
        assert (tmp_path / "site" / page).is_file(), page


def test_a_page_naming_a_flag_that_does_not_exist_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO_ROOT / "docs", docs, ignore=shutil.ignore_patterns("__pycache__"))
    (docs / "tutorial" / "first-run.md").write_text(
        (docs / "tutorial" / "first-run.md").read_text()
        + "\nThen `nexuscrm queue state demo/demo-contacts --no-such-flag`.\n"
    )
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {REPO_ROOT / 'mkdocs.yml'}\ndocs_dir: {docs}\n")
    done = build(config, tmp_path / "site")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "first-run.md" in done.stderr and "--no-such-flag: no such flag of nexuscrm" in done.stderr, done.stderr


def test_the_grpc_reference_names_every_service_rpc_message_field_and_enum_value() -> None:
    page = grpc_reference.render()
    expected = []
    for file in grpc_reference.descriptor_set().file:
        expected += [f"`{file.package}.{service.name}` (service)" for service in file.service]
        expected += [f"#### {service.name}.{method.name} " for service in file.service for method in service.method]
        stack = [(f"{file.package}.{message.name}", message) for message in file.message_type]
        enums = [(f"{file.package}.{enum.name}", enum) for enum in file.enum_type]
        while stack:
            name, message = stack.pop()
            if message.options.map_entry:
                continue
            expected.append(f"`{name}`")
            expected += [f"| `{field.name}` | {field.number} |" for field in message.field]
            stack += [(f"{name}.{nested.name}", nested) for nested in message.nested_type]
            enums += [(f"{name}.{enum.name}", enum) for enum in message.enum_type]
        for name, enum in enums:
            expected.append(f"`{name}` (enum)")
            expected += [f"| `{value.name}` | {value.number} |" for value in enum.value]
    missing = [text for text in expected if text not in page]
    assert len(expected) > 500 and missing == []


def test_the_grpc_reference_carries_the_protos_comments() -> None:
    page = grpc_reference.render()
    assert "Ingest stores each delivery durably and admits the new ones in one transaction per pack." in page


def test_the_command_reference_has_every_flag_of_every_command() -> None:
    page = commands_reference.render()
    flags = commands_reference.known_flags()
    missing = sorted(flag for flag in flags - {"-h", "--help"} if f"`{flag}`" not in page)
    assert {"--json", "--lanes", "-pack-install-id", "--dry-run"} <= flags and missing == []
    for name in commands_reference.COMMANDS:
        assert f"## `{name}`" in page, name


def test_the_sdk_reference_documents_exactly_the_exported_names() -> None:
    page = sdk_reference.render()
    documented = [
        line.removeprefix("::: nexuscrm_sdk.") for line in page.splitlines() if line.startswith("::: nexuscrm_sdk.")
    ]
    assert documented == list(nexuscrm_sdk.__all__)


def test_the_exit_code_and_metric_references_list_every_code_and_metric() -> None:
    codes = tables_reference.render_exit_codes()
    assert all(f"| {code.value} | `{code.name}` |" in codes for code in ExitCode)
    metrics = tables_reference.render_metrics()
    names = [row.name for _, rows in tables_reference.metric_sections() for row in rows]
    assert "nexuscrm_inputs_admitted_total" in names and "nexuscrm_queue_depth" in names
    assert all(f"| `{name}` |" in metrics for name in names)
