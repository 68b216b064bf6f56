"""Confidence bounds (qcls/heads/bounds.py) against closed forms and scipy's binomial tail."""
from __future__ import annotations

import pytest
from scipy.stats import binom

from qcls.heads import bounds


def test_clopper_pearson_lower_closed_form_at_all_right():
    # k = n: the bound solves p^n = 1 − c
    assert bounds.clopper_pearson_lower(151, 151, 0.9) == pytest.approx(0.1 ** (1 / 151))
    assert bounds.clopper_pearson_lower(0, 10, 0.9) == 0.0


@pytest.mark.parametrize("k,n,c", [(148, 151, 0.95), (30, 40, 0.9), (5, 9, 0.8)])
def test_clopper_pearson_lower_is_the_binomial_tail(k, n, c):
    lo = bounds.clopper_pearson_lower(k, n, c)
    assert binom.sf(k - 1, n, lo) == pytest.approx(1 - c, rel=1e-6)  # P(X ≥ k | p = lo) = 1 − c
    hi = bounds.clopper_pearson_upper(k, n, c)
    assert binom.cdf(k, n, hi) == pytest.approx(1 - c, rel=1e-6)


def test_issue_example_148_of_151():
    assert bounds.clopper_pearson_lower(148, 151, 0.95) == pytest.approx(0.949, abs=1e-3)


def test_wilson_known_values():
    lo, hi = bounds.wilson(140, 152)  # 0.921 on 152
    assert (round(lo, 3), round(hi, 3)) == (0.867, 0.954)
    assert bounds.wilson(0, 0) == (0.0, 1.0)
    assert bounds.shown(140, 152) == "0.921 [0.867, 0.954] n=152"


def test_more_needed():
    assert bounds.more_needed(151, 151, 0.95, 0.9) == 0
    assert bounds.more_needed(95, 100, 0.95, 0.9) is None  # not above the target: never
    m = bounds.more_needed(49, 50, 0.95, 0.9)
    assert m > 0 and bounds.clopper_pearson_lower(int((50 + m) * 0.98), 50 + m, 0.9) >= 0.95


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="successes"):
        bounds.wilson(5, 3)
    with pytest.raises(ValueError, match="confidence"):
        bounds.clopper_pearson_lower(1, 2, 1.0)


def test_promise_of_a_held_out_precision():
    assert bounds.promise(96, 100, 0.95, 0.9) == "met"
    assert bounds.promise(92, 100, 0.95, 0.9) == "within"  # the 90 % upper bound of 0.92 on 100 is above 0.95
    assert bounds.promise(85, 100, 0.95, 0.9) == "broken"
    assert bounds.promise(0, 0, 0.95, 0.9) == "none answered"
