"""The soak's growth verdict: a fitted slope after the warm-up, not a snapshot."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.system.soak.growth import Allowance, growth, slope_per_hour, verdict

INVARIANTS_NOT_CHECKED = "arithmetic on sample series; no database"
MINUTE = 60.0


def _series(values: Sequence[float]) -> list[tuple[float, float]]:
    return [(n * MINUTE, value) for n, value in enumerate(values)]


def test_a_steady_climb_is_fitted_per_hour() -> None:
    slope, error = slope_per_hour(_series([100 + n for n in range(10)]))
    assert slope == pytest.approx(60.0)
    assert error == pytest.approx(0.0, abs=1e-9)


def test_a_leak_is_unbounded_and_a_plateau_after_start_up_is_not() -> None:
    allowance = Allowance(per_hour=20.0, of_level=0.1)
    leak = growth("rss_mb", _series([100 + 2 * n for n in range(30)]), allowance)  # 120 MB/h
    plateau = growth("rss_mb", _series([50, 80, 95, 100, 100, 101, 100, 99, 101, 100, 100, 100]), allowance)
    assert leak.unbounded and leak.slope_per_hour == pytest.approx(120.0)
    assert not plateau.unbounded, plateau
    assert (plateau.start, plateau.end) == (50, 100)  # the snapshot would have said +50


def test_noise_around_a_level_is_bounded() -> None:
    noisy = [100 + (3 if n % 2 else -3) for n in range(20)]
    assert not growth("open_files", _series(noisy), Allowance(per_hour=10.0)).unbounded


def test_a_sawtooth_is_bounded_however_steep_its_line_over_a_short_run() -> None:
    """Tombstones expiring in bursts: the fitted line rises, but not by more than its error."""
    sawtooth = [3201, 3934, 1288, 2154, 1044, 0, 441, 0, 200, 1782, 1200, 3264, 1856, 975, 52, 1409, 2955, 2567]
    fit = growth("rows:PrunedReceipt", [(n * 10.0, v) for n, v in enumerate(sawtooth)], Allowance(per_hour=500.0))
    assert fit.slope_per_hour > fit.allowed_per_hour and not fit.unbounded, fit


def test_the_allowance_is_the_longest_listed_prefix() -> None:
    series = {"rows:Event": _series([1000 + 10 * n for n in range(10)]), "rss_mb": _series([100] * 10)}
    allowances = {
        "rows": Allowance(per_hour=0.0, of_level=1.0),
        "rows:Event": Allowance(per_hour=0.0),
        "rss_mb": Allowance(per_hour=1.0),
    }
    fits = verdict(series, allowances)
    assert [(fit.name, fit.unbounded) for fit in fits if fit.name == "rows:Event"] == [("rows:Event", True)]
    with pytest.raises(KeyError, match="no allowance for rss_mb"):
        verdict(series, {"rows": Allowance(per_hour=0.0)})


def test_too_few_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="3 samples after the warm-up, at least 4"):
        growth("lag_seconds", _series([1, 2, 3, 4, 5, 6]), Allowance(per_hour=60.0))
