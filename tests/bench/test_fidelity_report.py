"""bench/fidelity.py's winner disagreements against fp32, on scores worked out by hand."""
from __future__ import annotations

import pytest

from bench.fidelity import disagreements


def test_disagreements_name_each_flip_with_fp32s_margin_and_each_errors():
    truth = [[[1.0, 0.9, -2.0], [0.0, 3.0]]]  # one query, two prompts
    fast = [[[0.8, 0.95, -2.0], [0.0, 2.9]]]  # prompt 0 flips (0.95 > 0.8); prompt 1 keeps its winner
    hf = [[[1.05, 0.9, -2.1], [0.2, 3.0]]]  # keeps both
    (f,) = disagreements(fast, hf, truth)
    assert (f["query"], f["prompt"], f["fp32_winner"], f["fast_winner"], f["hf_winner"]) == (0, 0, 0, 1, 0)
    assert f["fp32_margin"] == pytest.approx(0.1)  # 1.0 - 0.9
    assert f["fast_error"] == pytest.approx(0.2) and f["hf_error"] == pytest.approx(0.1)
    assert disagreements(truth, truth, truth) == []
