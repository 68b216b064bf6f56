"""The sweep's coverage block (qcls/sweep/coverage.py) at a certified threshold: the precision on the scored split
against the promise, and the Wilson intervals of its shares."""
from __future__ import annotations

import numpy as np

from qcls.sweep.coverage import prompt_block
from qcls.heads.thresholds import Threshold


def _split(right_answered: int, answered: int, n: int):
    """n queries: the first `answered` confident (0.9), of which `right_answered` right; the rest at 0.3."""
    probs = np.tile([0.3, 0.7], (n, 1))
    probs[:answered] = [0.1, 0.9]
    gold = np.ones(n, int)
    gold[right_answered:answered] = 0
    return probs, gold


def test_the_promise_is_judged_on_the_scored_split():
    t = Threshold(0.8, fitted={"target_precision": 0.95, "confidence": 0.9, "lower_bound": 0.951, "n": 151})
    for right, want in ((58, "met"), (56, "within"), (50, "broken")):
        probs, gold = _split(right, 60, 100)
        at = prompt_block(probs, gold, ["a", "b"], t, None)["at_threshold"]
        assert at["answered"] == 60 and at["promise"]["verdict"] == want
        assert at["promise"]["fitted_lower_bound"] == 0.951 and at["intervals"]["precision"]["n"] == 60
        lo, hi = at["intervals"]["precision"]["low"], at["intervals"]["precision"]["high"]
        assert lo < right / 60 < hi


def test_a_threshold_without_a_bound_says_it_was_not_certified():
    probs, gold = _split(56, 60, 100)
    at = prompt_block(probs, gold, ["a", "b"], Threshold(0.8, fitted={"target_precision": 0.95}), None)["at_threshold"]
    assert at["promise"]["verdict"] == "not certified"
    at = prompt_block(probs, gold, ["a", "b"], Threshold(0.8, fitted={"target_coverage": 0.5}), None)["at_threshold"]
    assert "promise" not in at and at["intervals"]["coverage"]["value"] == 0.6
