"""The site's build hooks: generated reference pages in, pages naming what does not exist out.

``on_page_markdown`` logs a warning for each file, module, flag or version a page names that
does not exist (``page_checks``), which ``mkdocs build --strict`` turns into a failed build,
then fills the page's placeholders with what the code and the contract render
(``generated.GENERATED``: the reference pages and tables, never committed).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mkdocs.structure.pages import Page

from docs.hooks.generated import GENERATED
from docs.hooks.page_checks import broken_references

log = logging.getLogger("mkdocs.hooks.nexuscrm")


def fill_tables(markdown: str) -> str:
    """``markdown`` with each placeholder replaced by what it renders."""
    for placeholder, render in GENERATED.items():
        if placeholder in markdown:
            markdown = markdown.replace(placeholder, render())
    return markdown


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    """Check a page's references (a warning each), then fill its placeholders."""
    if page.file.abs_src_path:
        for problem in broken_references(Path(page.file.abs_src_path), markdown):
            log.warning("documentation names what does not exist: %s", problem)
    return fill_tables(markdown)
