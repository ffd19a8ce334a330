"""Statistics of a timing: bootstrap intervals of per-round ratios, the verdict a ratio earns
against the run's noise floor (its A/A row), the drift bracket, and the comparison of a run
with a stored one (the regression gate).

Every interval is a percentile bootstrap (seeded numpy Generator, so a run's intervals are
reproducible): the rounds are resampled with replacement and the statistic recomputed. A
per-round ratio is paired (both sides timed in the same round), so a round is resampled as a
pair; two runs of different days are not paired, so each is resampled on its own.
"""
import math

import numpy as np

LEVEL = 0.95            # two-sided confidence of every interval
BOOT = 4000             # bootstrap resamples
SEED = 0
DRIFT_TOL = 0.05        # the control's last samples over its first beyond 1 +- this: drift


def _finite(vals) -> list:
    """The usable samples: a NaN, inf, None or non-positive time is dropped (a NaN kept would
    make a median NaN, and a NaN interval compares false both ways: never a regression)."""
    return [x for x in vals if x is not None and math.isfinite(x) and x > 0]


def _q(level: float) -> tuple:
    a = (1 - level) / 2
    return a, 1 - a


def bootstrap_median(vals, *, boot: int = BOOT, seed: int = SEED, level: float = LEVEL) -> dict | None:
    """{median, lo, hi, n}: the median of `vals` and its percentile-bootstrap interval."""
    v = np.asarray([x for x in vals if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(boot, v.size))
    meds = np.median(v[idx], axis=1)
    qlo, qhi = _q(level)
    return {"median": float(np.median(v)), "lo": float(np.quantile(meds, qlo, method="inverted_cdf")),
            "hi": float(np.quantile(meds, qhi, method="inverted_cdf")), "n": int(v.size), "level": level}


def ratio_interval(tx, ty, **kw) -> dict | None:
    """Speedup of y over x per round (t_x / t_y, > 1: y faster): median, min, max, n (the old
    spread) and lo, hi, the bootstrap interval of the median over the rounds."""
    r = [a / b for a, b in zip(tx, ty) if a is not None and b is not None and b > 0 and math.isfinite(a / b)]
    ci = bootstrap_median(r, **kw)
    if ci is None:
        return None
    return {**ci, "min": min(r), "max": max(r)}


def unpaired_ratio(old, new, *, boot: int = BOOT, seed: int = SEED, level: float = LEVEL) -> dict | None:
    """median(old) / median(new) (> 1: new is faster) with a bootstrap interval that resamples
    each run on its own (rounds of two runs are not paired)."""
    a = np.asarray(_finite(old), dtype=np.float64)
    b = np.asarray(_finite(new), dtype=np.float64)
    if a.size == 0 or b.size == 0:
        return None
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, a.size, size=(boot, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, size=(boot, b.size))], axis=1)
    r = ma / mb
    qlo, qhi = _q(level)
    return {"median": float(np.median(a) / np.median(b)), "lo": float(np.quantile(r, qlo, method="inverted_cdf")),
            "hi": float(np.quantile(r, qhi, method="inverted_cdf")), "n": (int(a.size), int(b.size)),
            "level": level}


def rel_width(ci: dict | None) -> float:
    """(hi - lo) / median; inf without an interval."""
    if not ci or not ci.get("median"):
        return math.inf
    return (ci["hi"] - ci["lo"]) / ci["median"]


def noise_band(aa: dict | None) -> tuple:
    """The band a ratio must leave to be a difference: the A/A row's interval, widened to
    include 1 (with no A/A row: just 1)."""
    if not aa:
        return 1.0, 1.0
    return min(1.0, aa["lo"]), max(1.0, aa["hi"])


def verdict(ci: dict | None, aa: dict | None = None) -> str:
    """'faster' (y faster than x: the whole interval above the noise band), 'slower' (below
    it), 'within noise' (it overlaps the band), or 'not measured'."""
    if not ci or "lo" not in ci:
        return "not measured"
    lo, hi = noise_band(aa)
    if ci["lo"] > hi:
        return "faster"
    if ci["hi"] < lo:
        return "slower"
    return "within noise"


def drift(first, last) -> dict | None:
    """The drift bracket: the control's samples before the first round and after the last.
    ratio = median(last) / median(first) (> 1: the control got slower); flagged beyond
    DRIFT_TOL."""
    f = _finite(first)
    la = _finite(last)
    if not f or not la:
        return None
    r = float(np.median(la) / np.median(f))
    return {"first": float(np.median(f)), "last": float(np.median(la)), "ratio": r,
            "flagged": abs(r - 1) > DRIFT_TOL, "tol": DRIFT_TOL}
