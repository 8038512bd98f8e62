"""Every scenario test ends here: the invariant checker as an assertion."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from nexuscrm_schema.invariants import bounds_violations, check_invariants, generation_bounds, window_violations

__all__ = ["assert_invariants", "bounds_violations", "check_invariants", "generation_bounds", "window_violations"]


def assert_invariants(engine: sa.Engine, *, damaged: Iterable[tuple[str, int]] = ()) -> None:
    """Fail with every violation of M, O, B, D, X, P and R (retention) in the database.

    ``damaged`` lists (pack, ordinal) inputs whose generation a test deleted on purpose: each
    must show up as exactly that M violation, and nothing else may.
    """
    expected = {f"M: Event {pack}/{ordinal} is a member of 0 generations []" for pack, ordinal in damaged}
    problems = check_invariants(engine)
    missing = expected - set(problems)
    assert not missing, f"damage not detected by the checker: {sorted(missing)}"
    problems = [p for p in problems if p not in expected]
    assert not problems, "invariant violations:\n" + "\n".join(problems[:50])
