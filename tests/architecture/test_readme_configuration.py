"""The README's configuration tables name every environment variable a service or library reads."""

from __future__ import annotations

import dataclasses
import re

from nexuscrm_connectors.settings import Settings
from tests.conftest import REPO_ROOT

SOURCES = ("libs", "services")  # what services read; the operator tools document theirs in --help


def configuration_section() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    return readme.split("## Configuration", 1)[1].split("### Supported multi-writer topology", 1)[0]


def documented(section: str) -> list[re.Pattern[str]]:
    """Each variable of the tables as a pattern: ``<SERVICE>`` and the like stand for one word or more."""
    names = set(re.findall(r"`(NEXUSCRM_[A-Z_<>]+)`", section))
    return [re.compile(re.sub(r"<[A-Z]+>", "[A-Z_]+", name) + "$") for name in names]


def read_by_the_code() -> set[str]:
    found: set[str] = set()
    for source in SOURCES:
        for path in (REPO_ROOT / source).rglob("*.py"):
            found |= set(re.findall(r"\bNEXUSCRM_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    found |= {f"NEXUSCRM_{field.name.upper()}" for field in dataclasses.fields(Settings)}
    return found


def test_every_variable_the_code_reads_is_in_the_configuration_tables() -> None:
    patterns = documented(configuration_section())
    missing = sorted(name for name in read_by_the_code() if not any(p.match(name) for p in patterns))
    assert missing == []


def test_the_connectors_defaults_in_the_readme_are_the_settings_defaults() -> None:
    section = configuration_section()
    defaults = Settings()
    for field in dataclasses.fields(Settings):
        row = next(line for line in section.splitlines() if f"`NEXUSCRM_{field.name.upper()}`" in line)
        value = str(getattr(defaults, field.name))
        assert f"`{value}`" in row or f" {value}`" in row or f"`{value}," in row, (field.name, row)
