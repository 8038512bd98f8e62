"""The soak's verdict: does a sampled resource grow without bound?

Each resource is a series of (seconds since the start, value) samples. A snapshot (the last
value against the first) mistakes start-up (caches filling, tables reaching the level
retention holds them at) and noise for growth, so the verdict fits a least-squares line to
the samples after a warm-up and compares its slope, per hour, with what the resource may
gain in an hour: an absolute allowance plus a fraction of its median level. A bounded resource
levels off and its slope after the warm-up is near zero; a leak keeps a positive slope however
long the run. A bounded resource may still swing (tombstones expiring in bursts, memory
dropping at each restart), and over a short run a swing fits a steep line; so the slope
counts only by what the samples make certain: its lower bound, the slope less ``CONFIDENCE``
standard errors, must exceed the allowance. Minute samples of a slowly drifting level are not
independent (a swing of tens of minutes leaves long runs of residuals on one side of the line),
so the standard error is widened by the residuals' lag-1 autocorrelation, as for any trend
fitted to a time series; a leak's residuals are its noise, uncorrelated, and keep their error.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence

HOUR = 3600.0  # seconds
# The fraction of the samples (the first ones) left out of the fit: start-up, and the time
# retention needs to level the tables off (its age, then the tombstones' window, then the lag
# of the passes; on a slow server the first five-minute MariaDB run took 2.5 minutes).
WARM_UP = 0.5
MIN_SAMPLES = 4  # samples after the warm-up below which no slope is trusted
CONFIDENCE = 2.0  # standard errors taken off the slope before it is compared (about 97.5 % one-sided)
MAX_AUTOCORRELATION = 0.9  # at most a 4.4-fold error: a perfectly smooth curve still has a finite error


@dataclasses.dataclass(frozen=True)
class Allowance:
    """What a resource may gain per hour and still count as bounded."""

    per_hour: float  # in the resource's unit
    of_level: float = 0.0  # plus this fraction of the series' median per hour


@dataclasses.dataclass(frozen=True)
class Growth:
    """One resource's fit: its first and last sample, its slope and its allowance (per hour)."""

    name: str
    start: float
    end: float
    slope_per_hour: float
    error_per_hour: float  # the slope's standard error
    allowed_per_hour: float

    @property
    def unbounded(self) -> bool:
        """True when even the slope's lower bound exceeds the allowance."""
        return self.slope_per_hour - CONFIDENCE * self.error_per_hour > self.allowed_per_hour


def slope_per_hour(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares slope of ``samples`` ((seconds, value) pairs) and its standard error, per hour.

    The error is widened by ``sqrt((1 + r) / (1 - r))``, r the residuals' lag-1 autocorrelation
    (0 when they alternate or are all zero, at most ``MAX_AUTOCORRELATION``): the number of
    independent samples a correlated series holds.
    """
    times = [t for t, _ in samples]
    values = [v for _, v in samples]
    if len(set(times)) < 2:
        raise ValueError("a slope needs samples at two different times at least")
    line = statistics.linear_regression(times, values)
    mean = statistics.fmean(times)
    spread = sum((t - mean) ** 2 for t in times)
    residuals = [v - (line.slope * t + line.intercept) for t, v in samples]
    squares = sum(r * r for r in residuals)
    error = math.sqrt(squares / (len(samples) - 2) / spread) if len(samples) > 2 else 0.0
    lagged = sum(a * b for a, b in itertools.pairwise(residuals))
    r = min(max(lagged / squares, 0.0), MAX_AUTOCORRELATION) if squares else 0.0
    return line.slope * HOUR, error * math.sqrt((1 + r) / (1 - r)) * HOUR


def growth(name: str, samples: Sequence[tuple[float, float]], allowance: Allowance) -> Growth:
    """The fit of one resource's samples after the warm-up."""
    fitted = samples[int(len(samples) * WARM_UP) :]
    if len(fitted) < MIN_SAMPLES:
        raise ValueError(f"{name}: {len(fitted)} samples after the warm-up, at least {MIN_SAMPLES} are needed")
    level = statistics.median(v for _, v in fitted)
    slope, error = slope_per_hour(fitted)
    return Growth(
        name=name,
        start=samples[0][1],
        end=samples[-1][1],
        slope_per_hour=slope,
        error_per_hour=error,
        allowed_per_hour=allowance.per_hour + allowance.of_level * abs(level),
    )


def verdict(series: Mapping[str, Sequence[tuple[float, float]]], allowances: Mapping[str, Allowance]) -> list[Growth]:
    """Each resource's fit; a resource's allowance is that of the longest prefix of its name listed."""
    fits = []
    for name, samples in sorted(series.items()):
        kind = max((key for key in allowances if name.startswith(key)), key=len, default=None)
        if kind is None:
            raise KeyError(f"no allowance for {name}")
        fits.append(growth(name, samples, allowances[kind]))
    return fits
