"""bench/nested_cv.py's table on synthetic rows worked out by hand: one block per model and folds, and the nested
gap's shift from one fold count to another paired on the same (split, prompt) pairs only."""
from __future__ import annotations

import pytest

nested_cv = pytest.importorskip("bench.nested_cv")


def row(folds, seed, prompt, nested, other, **kw):
    verdict = {"reached": True, "answered": 10, "right": 10}
    r = {"model": "m", "folds": folds, "seed": seed, "prompt": prompt, "n_other": 20, "other_accuracy": other,
         "cv_current": other, "cv_nested": nested, "seconds_selection": 2.0, "seconds_nested": 4.0,
         "point": verdict, "bound": verdict}
    r.update(kw)
    return r


def test_each_fold_count_has_its_rows_and_the_shift_is_paired():
    rows = [row(3, 0, "a", 0.80, 0.90), row(3, 1, "a", 0.70, 0.80),
            row(5, 0, "a", 0.86, 0.91), row(5, 1, "a", 0.74, 0.70),
            row(3, 2, "a", 0.10, 0.90)]  # split 2 has no 5-fold fit: left out of the shift, kept in 3's block
    text = nested_cv.summary(rows)
    lines = {tuple(c.strip() for c in ln.split("|")[1:4]): ln for ln in text.splitlines() if ln.startswith("| m |")}
    nested3 = lines[("m", "3", "bound: 90 % Clopper–Pearson lower bound ≥ 0.95, nested out-of-fold")]
    assert "3 of 3" in nested3 and "-0.3333" in nested3  # (−0.1 − 0.1 − 0.8) / 3
    nested5 = lines[("m", "5", "bound: 90 % Clopper–Pearson lower bound ≥ 0.95, nested out-of-fold")]
    assert "2 of 2" in nested5 and "-0.0050" in nested5  # (−0.05 + 0.04) / 2
    # gap at 5 − gap at 3 over splits 0 and 1: (+0.05 + 0.14) / 2 ± 0.09 / 2; nested accuracy (+0.06 + 0.04) / 2
    assert "m, 5 − 3 folds: gap +0.0950 ± 0.0450, nested accuracy +0.0500 ± 0.0100 (2 pairs)" in text


def test_rows_without_folds_are_three_fold_fits():
    rows = [row(3, 0, "a", 0.8, 0.9)]
    del rows[0]["folds"]
    text = nested_cv.summary(rows)
    assert "| m | 3 | point" in text and "m, 3 folds: the search 2 s" in text
    assert "More folds" not in text  # one fold count: nothing to pair


def test_outer_and_inner_folds_are_one_fold_count():
    assert nested_cv.fold_counts("5/3") == (5, 3) and nested_cv.fold_counts("4") == (4, 4)
    rows = [row("3", 0, "a", 0.80, 0.90), row("5/3", 0, "a", 0.85, 0.90)]
    text = nested_cv.summary(rows)
    assert "| m | 5/3 | point" in text
    assert "m, 5/3 − 3 folds: gap +0.0500" in text  # the first fold count asked is the baseline
