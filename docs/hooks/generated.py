"""What the build generates into the written pages: placeholder -> renderer.

Each reference page of the site is committed as a page holding its placeholder, so every page a
link names is a file of the repository; the build replaces the placeholder with the rendered
reference (``mkdocs_hooks.on_page_markdown``), never committed.
"""

from __future__ import annotations

from collections.abc import Callable

from docs.hooks import commands_reference, grpc_reference, sdk_reference, tables_reference

GENERATED: dict[str, Callable[[], str]] = {
    "<!-- generated: command line reference -->": commands_reference.render,
    "<!-- generated: gRPC reference -->": grpc_reference.render,
    "<!-- generated: SDK reference -->": sdk_reference.render,
    "<!-- generated: exit codes -->": tables_reference.render_exit_codes,
    "<!-- generated: metrics -->": tables_reference.render_metrics,
    "<!-- generated: connectors settings -->": tables_reference.render_settings_table,
}
