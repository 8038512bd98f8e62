"""The soak's growth verdict: a fitted slope after the warm-up, not a snapshot."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import pytest

from tests.system.soak.growth import (
    CONFIDENCE,
    Allowance,
    growth,
    slope_per_hour,
    verdict,
)

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


def _plain_error(samples: Sequence[tuple[float, float]]) -> float:
    """The textbook standard error of a least-squares slope (independent residuals), per hour."""
    line = statistics.linear_regression([t for t, _ in samples], [v for _, v in samples])
    mean = statistics.fmean(t for t, _ in samples)
    squares = sum((v - line.slope * t - line.intercept) ** 2 for t, v in samples)
    return math.sqrt(squares / (len(samples) - 2) / sum((t - mean) ** 2 for t, _ in samples)) * 3600


def test_a_swing_slower_than_the_fit_is_bounded_and_a_leak_under_a_swing_is_not() -> None:
    """The SQLite hour's PrunedWork: a 40-minute swing, low at minute 40, fits a steep line with smooth residuals."""
    allowance = Allowance(per_hour=5_000.0)
    swing = [24_000 - 5_000 * math.cos(2 * math.pi * (n - 10) / 40) + (150 if n % 2 else -150) for n in range(30)]
    fit = growth("rows:PrunedWork", _series([0.0] * 30 + swing), allowance)
    assert fit.slope_per_hour - CONFIDENCE * _plain_error(_series(swing)) > allowance.per_hour  # the old verdict
    assert not fit.unbounded, fit
    leak = [v + 2_000 * n for n, v in enumerate(swing)]  # the same swing on a 120 000 rows/h climb
    assert growth("rows:PrunedWork", _series([0.0] * 30 + leak), allowance).unbounded


def test_a_leak_with_independent_noise_keeps_its_textbook_error() -> None:
    noise = [7, -3, 5, -9, 2, -8, 6, -1, 4, -6, 8, -3, 9, -2, 7, -4, 5, 0, 8, -1]
    samples = _series([100 + 2 * n + e for n, e in enumerate(noise)])
    slope, error = slope_per_hour(samples)
    assert error == pytest.approx(_plain_error(samples)) and slope == pytest.approx(120.0, rel=0.1)
    assert growth("rss_mb", [(t - 3600, 100.0) for t, _ in samples] + samples, Allowance(per_hour=20.0)).unbounded


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
