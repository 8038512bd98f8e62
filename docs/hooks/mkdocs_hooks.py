"""The site's build hooks: generated reference pages in, pages naming what does not exist out.

``on_files`` adds the reference pages rendered from the code and the contract (never
committed: ``commands_reference``, ``grpc_reference``, ``tables_reference``, ``sdk_reference``);
``on_page_markdown`` fills a page's generated tables and logs a warning for each file, module,
flag or version a written page names that does not exist (``page_checks``), which
``mkdocs build --strict`` turns into a failed build.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from docs.hooks import tables_reference
from docs.hooks.generated import GENERATED
from docs.hooks.page_checks import broken_references

log = logging.getLogger("mkdocs.hooks.nexuscrm")

# Placeholders a written page holds where a generated table goes.
TABLES: dict[str, Callable[[], str]] = {
    "<!-- generated: connectors settings -->": tables_reference.render_settings_table,
}


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """Add each generated reference page."""
    for uri, render in GENERATED.items():
        files.append(File.generated(config, uri, content=render()))
    return files


def fill_tables(markdown: str) -> str:
    """``markdown`` with each generated-table placeholder replaced by its table."""
    for placeholder, render in TABLES.items():
        markdown = markdown.replace(placeholder, render())
    return markdown


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    """Check a written page's references (a warning each), then fill its generated tables."""
    if page.file.generated_by is None and page.file.abs_src_path:
        for problem in broken_references(Path(page.file.abs_src_path), markdown):
            log.warning("documentation names what does not exist: %s", problem)
    return fill_tables(markdown)
