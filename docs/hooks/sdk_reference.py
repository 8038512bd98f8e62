"""The SDK reference: one mkdocstrings section per name of ``nexuscrm_sdk.__all__``.

The page lists exactly the public surface a Flow author imports (decision 154); mkdocstrings
renders each from its docstring and signature when the site is built.
"""

from __future__ import annotations

import nexuscrm_sdk


def render() -> str:
    """The SDK page: the package's docstring, then each exported name in ``__all__`` order."""
    lines = [
        "# SDK (`nexuscrm_sdk`)",
        "",
        "Generated at build time from the docstrings of every name in `nexuscrm_sdk.__all__`",
        "(`docs/hooks/sdk_reference.py`). The SDK's guide: `libs/connectors_sdk/README.md`.",
        "",
        "::: nexuscrm_sdk",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "",
    ]
    for name in nexuscrm_sdk.__all__:
        lines += [f"::: nexuscrm_sdk.{name}", ""]
    return "\n".join(lines)
