"""The configuration reference names every environment variable a service or library reads.

The page is docs/reference/configuration.md with its generated tables filled in, as the site's
build fills them (Connectors' table comes from ``Settings`` itself, so its defaults cannot drift).
"""

from __future__ import annotations

import dataclasses
import re

from docs.hooks.mkdocs_hooks import fill_tables
from nexuscrm_connectors.settings import Settings
from tests.conftest import REPO_ROOT

SOURCES = ("libs", "services")  # what services read; the operator tools document theirs in --help
PAGE = REPO_ROOT / "docs" / "reference" / "configuration.md"


def documented(page: str) -> list[re.Pattern[str]]:
    """Each variable of the tables as a pattern: ``<SERVICE>`` and the like stand for one word or more."""
    names = set(re.findall(r"`(NEXUSCRM_[A-Z_<>]+)`", page))
    return [re.compile(re.sub(r"<[A-Z]+>", "[A-Z_]+", name) + "$") for name in names]


def read_by_the_code() -> set[str]:
    found: set[str] = set()
    for source in SOURCES:
        for path in (REPO_ROOT / source).rglob("*.py"):
            found |= set(re.findall(r"\bNEXUSCRM_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    found |= {f"NEXUSCRM_{field.name.upper()}" for field in dataclasses.fields(Settings)}
    return found


def test_every_variable_the_code_reads_is_on_the_configuration_page() -> None:
    patterns = documented(fill_tables(PAGE.read_text()))
    missing = sorted(name for name in read_by_the_code() if not any(p.match(name) for p in patterns))
    assert missing == []


def test_the_generated_connectors_table_has_a_meaning_for_every_setting() -> None:
    page = fill_tables(PAGE.read_text())
    for field in dataclasses.fields(Settings):
        row = next(line for line in page.splitlines() if line.startswith(f"| `NEXUSCRM_{field.name.upper()}` |"))
        meaning = row.split(" | ")[1]
        assert meaning.strip(), f"Settings' docstring has no entry for {field.name}"
