"""Metrics against values worked out by hand (the arithmetic is in the comments)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from qcls.eval import metrics

# labels A=0, B=1, C=2, D=3; D is never gold and never predicted
GOLD = np.array([0, 0, 1, 1, 2, 2])
PRED = np.array([0, 1, 1, 1, 0, 2])


def test_accuracy_by_hand():
    # right at positions 0, 2, 3, 5 → 4 of 6
    assert metrics.accuracy(PRED, GOLD) == pytest.approx(4 / 6)


def test_confusion_and_macro_f1_by_hand():
    # rows = gold, columns = predicted
    #   gold A: predicted A once, B once  → [1, 1, 0, 0]
    #   gold B: predicted B twice         → [0, 2, 0, 0]
    #   gold C: predicted A once, C once  → [1, 0, 1, 0]
    m = metrics.confusion(PRED, GOLD, 4)
    assert m.tolist() == [[1, 1, 0, 0], [0, 2, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    # F1 = 2tp / (2tp + fp + fn)
    #   A: tp 1, fp 1 (gold C predicted A), fn 1 (gold A predicted B) → 2/4 = 0.5
    #   B: tp 2, fp 1 (gold A predicted B), fn 0                     → 4/5 = 0.8
    #   C: tp 1, fp 0, fn 1                                          → 2/3
    #   D: never predicted, never gold → left out (counting it as 0 would give 0.4917)
    # macro-F1 = (0.5 + 0.8 + 2/3) / 3 = 1.96667 / 3 = 0.655556
    f1 = metrics.per_label_f1(PRED, GOLD, 4)
    assert f1[:3] == pytest.approx([0.5, 0.8, 2 / 3]) and math.isnan(f1[3])
    assert metrics.macro_f1(PRED, GOLD, 4) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert metrics.macro_f1(PRED, GOLD, 4) == pytest.approx(0.655556, abs=1e-6)


def test_ece_by_hand():
    # 15 bins of width 1/15 = 0.0667, bin k = (k/15, (k+1)/15]
    probs = np.array([[0.90, 0.05, 0.05],   # winner 0, gold 0: conf 0.90 → bin 13 (0.867, 0.933], right
                      [0.85, 0.10, 0.05],   # winner 0, gold 1: conf 0.85 → bin 12 (0.800, 0.867], wrong
                      [0.50, 0.30, 0.20],   # winner 0, gold 0: conf 0.50 → bin 7  (0.467, 0.533], right
                      [0.20, 0.45, 0.35],   # winner 1, gold 2: conf 0.45 → bin 6  (0.400, 0.467], wrong
                      [0.10, 0.12, 0.78],   # winner 2, gold 2: conf 0.78 → bin 11 (0.733, 0.800], right
                      [0.88, 0.06, 0.06]])  # winner 0, gold 0: conf 0.88 → bin 13, right
    gold = np.array([0, 1, 0, 2, 2, 0])
    # bin 13: 2 queries, accuracy 1, mean confidence (0.90 + 0.88) / 2 = 0.89 → gap 0.11, weight 2/6
    # bins 12, 7, 6, 11: one query each, gaps |0 − 0.85|, |1 − 0.5|, |0 − 0.45|, |1 − 0.78|, weight 1/6
    # ECE = (2 · 0.11 + 0.85 + 0.50 + 0.45 + 0.22) / 6 = 2.24 / 6 = 0.373333
    assert metrics.ece(probs, gold) == pytest.approx(2.24 / 6)
    r = metrics.reliability(probs, gold)
    assert r["count"][13] == 2 and r["count"].sum() == 6
    assert r["confidence"][13] == pytest.approx(0.89) and r["accuracy"][13] == 1.0


def test_ece_bins_are_right_closed_and_cover_one():
    # confidence 1.0 falls in the last bin (14/15, 1], not past it; right and sure → no gap
    assert metrics.reliability(np.array([[1.0, 0.0]]), np.array([0]))["count"][14] == 1
    assert metrics.ece(np.array([[1.0, 0.0]]), np.array([0])) == 0.0
    # a perfectly calibrated case: 4 queries at conf 0.75, 3 right → gap 0
    probs = np.array([[0.75, 0.25]] * 4)
    assert metrics.ece(probs, np.array([0, 0, 0, 1])) == pytest.approx(0.0, abs=1e-12)


def test_nll_and_brier_by_hand():
    # query 1: scores [0, ln 3] → p = [1/4, 3/4], gold 1 → −ln 0.75 = 0.287682
    #          Brier (0.25 − 0)² + (0.75 − 1)² = 0.0625 + 0.0625 = 0.125
    # query 2: scores [0, 0] → p = [1/2, 1/2], gold 0 → ln 2 = 0.693147; Brier 0.25 + 0.25 = 0.5
    # NLL = (0.287682 + 0.693147) / 2 = 0.490415; Brier = (0.125 + 0.5) / 2 = 0.3125
    scores = np.array([[0.0, math.log(3)], [0.0, 0.0]])
    gold = np.array([1, 0])
    assert metrics.nll(scores, gold) == pytest.approx(0.490415, abs=1e-6)
    assert metrics.brier(metrics.softmax(scores), gold) == pytest.approx(0.3125)
    # a gold label far below the winner: the NLL stays finite (log-softmax, no underflow to 0)
    assert metrics.nll(np.array([[0.0, 2000.0]]), np.array([0])) == pytest.approx(2000.0)


def test_prompt_metrics_bundle_and_means():
    scores = np.log(np.array([[0.90, 0.05, 0.05], [0.85, 0.10, 0.05], [0.20, 0.45, 0.35]]))
    gold = np.array([0, 1, 2])
    m = metrics.prompt_metrics(scores, gold, ["a", "b", "c"])
    assert m["n"] == 3 and m["accuracy"] == pytest.approx(1 / 3)
    assert m["confusion"]["labels"] == ["a", "b", "c"]
    assert m["confusion"]["matrix"] == [[1, 0, 0], [1, 0, 0], [0, 1, 0]]
    # a: tp 1, fp 1 → 2/3; b: tp 0, fp 1, fn 1 → 0; c: tp 0, fn 1 → 0 → macro (2/3) / 3
    assert m["macro_f1"] == pytest.approx(2 / 9)
    assert m["f1"] == {"a": pytest.approx(2 / 3), "b": 0.0, "c": 0.0}
    mean = metrics.mean_over_prompts({"p": {"n": 2, "accuracy": 0.5}, "q": {"n": 4, "accuracy": 1.0},
                                      "r": {"n": 0}}, ["accuracy", "nll"])
    assert mean == {"accuracy": 0.75, "nll": None}  # each prompt counts once; prompts without data are out


def test_majority_baseline_by_hand():
    assert metrics.majority_accuracy(np.array([0, 1, 1, 2])) == 0.5
    assert metrics.majority_accuracy(np.array([3, 3, 3])) == 1.0
    m = metrics.calibration_metrics(np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]]), np.array([0, 0, 1]))
    assert m["accuracy"] == pytest.approx(1 / 3) and m["macro_f1"] == pytest.approx((0.5 + 0.0) / 2)
