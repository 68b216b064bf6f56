"""Confidence bounds on a share of successes (accuracy, precision of the answered, coverage) out of n.

- `clopper_pearson_lower`: the exact one-sided lower bound a precision target is certified with (thresholds:
  qcls/heads/thresholds.py). With confidence c, a true share below it gives k or more successes out of n with
  probability at most 1 − c.
- `wilson`: the two-sided Wilson score interval every reported share carries (95 % by default): it keeps its
  coverage near the nominal level for small n and shares near 0 or 1, where the normal interval does not.
- `more_needed`: how many more labelled queries would let a bound reach a target, if the observed share held.
- `promise`: whether a held-out precision keeps a certified target (`qcls sweep` on a labelled split).
"""
from __future__ import annotations

import math

from scipy.stats import beta, norm


def clopper_pearson_lower(k: int, n: int, confidence: float) -> float:
    """The one-sided lower confidence bound of a share from k successes out of n (0 when k is 0 or n is 0)."""
    _check(k, n, confidence)
    if k == 0:
        return 0.0
    return float(beta.ppf(1.0 - confidence, k, n - k + 1))


def clopper_pearson_upper(k: int, n: int, confidence: float) -> float:
    """The one-sided upper confidence bound (1 when k is n)."""
    _check(k, n, confidence)
    if k >= n:
        return 1.0
    return float(beta.ppf(confidence, k + 1, n - k))


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided Wilson score interval of k successes out of n ((0, 1) when n is 0)."""
    _check(k, n, confidence)
    if n == 0:
        return 0.0, 1.0
    z = float(norm.ppf(0.5 + confidence / 2))
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def shown(k: int, n: int, confidence: float = 0.95, digits: int = 3) -> str:
    """'0.921 [0.866, 0.954] n=152': a share with its Wilson interval and n."""
    if n == 0:
        return "- n=0"
    lo, hi = wilson(k, n, confidence)
    return f"{k / n:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] n={n}"


def as_dict(k: int, n: int, confidence: float = 0.95) -> dict:
    """{value, low, high, n, confidence} of a share (value None when n is 0), for JSON results."""
    lo, hi = wilson(k, n, confidence)
    return {"value": k / n if n else None, "low": round(lo, 4), "high": round(hi, 4), "n": int(n),
            "confidence": confidence}


def promise(k: int, n: int, target: float, confidence: float) -> str:
    """How k right of n answered held-out queries stand against a precision certified ≥ `target` at
    `confidence`: `met` (observed ≥ target), `within` (below it, but the one-sided upper bound at that confidence
    still reaches it: a shortfall the promise allows), `broken` (even the upper bound is under it), `none answered`."""
    if n == 0:
        return "none answered"
    if k / n >= target:
        return "met"
    return "within" if clopper_pearson_upper(k, n, confidence) >= target else "broken"


def more_needed(k: int, n: int, target: float, confidence: float, limit: int = 100_000) -> int | None:
    """The fewest further queries m such that, with the same share k / n among all n + m, the lower bound at
    `confidence` reaches `target` (0 when it already does); None when the share k / n is not above the target
    (no number of queries certifies it) or more than `limit` would be needed."""
    _check(k, n, confidence)
    if n == 0 or k / n <= target:
        return None
    share = k / n

    def reaches(total: int) -> bool:
        return clopper_pearson_lower(int(math.floor(share * total + 1e-9)), total, confidence) >= target

    if reaches(n):
        return 0
    lo, hi = n, n
    while not reaches(hi):
        lo, hi = hi, hi * 2
        if hi - n > limit:
            return None
    while hi - lo > 1:  # the bound rises with the total at a fixed share (up to the floor's steps)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi - n


def _check(k: int, n: int, confidence: float) -> None:
    if not 0 <= k <= n:
        raise ValueError(f"a share needs 0 ≤ successes ≤ trials (got {k} of {n})")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence}: give a level in (0, 1), e.g. 0.9")
