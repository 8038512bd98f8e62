"""The pages the build generates (path below docs/ -> renderer); none is committed."""

from __future__ import annotations

from collections.abc import Callable

from docs.hooks import commands_reference, grpc_reference, sdk_reference, tables_reference

GENERATED: dict[str, Callable[[], str]] = {
    "reference/cli.md": commands_reference.render,
    "reference/grpc.md": grpc_reference.render,
    "reference/sdk.md": sdk_reference.render,
    "reference/exit-codes.md": tables_reference.render_exit_codes,
    "reference/metrics.md": tables_reference.render_metrics,
}
