"""Abstention thresholds (qcls/heads/thresholds.py): the fit on a hand-worked example, an unreachable target,
the head file round trip (older files without thresholds still load), and a classifier's results abstaining."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from qcls.heads import files, thresholds
from qcls.heads.files import CalibrationError
from qcls.heads.head import Head, PromptHead
from qcls.heads.thresholds import Threshold
from qcls.results import LabelScore, PromptResult
from tests.conftest import prompt, tiny_cfg

# six held-out winners, worked by hand (sorted by probability; 0.8 is tied):
#   threshold  answered  right  precision  coverage
#   0.9        1         1      1.000      1/6
#   0.8        3         2      0.667      3/6     (the tie answers both 0.8 queries)
#   0.7        4         3      0.750      4/6
#   0.6        5         3      0.600      5/6
#   0.5        6         4      0.667      6/6
PROB = np.array([0.6, 0.9, 0.8, 0.5, 0.7, 0.8])
RIGHT = np.array([False, True, False, True, True, True])


def test_curve_by_hand():
    c = thresholds.curve(PROB, RIGHT)
    assert c.thresholds.tolist() == [0.9, 0.8, 0.7, 0.6, 0.5]
    assert c.coverage.tolist() == pytest.approx([1 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0])
    assert c.precision.tolist() == pytest.approx([1.0, 2 / 3, 3 / 4, 3 / 5, 4 / 6])
    assert c.errors == 2


@pytest.mark.parametrize("target,threshold,precision,coverage", [
    (0.7, 0.7, 3 / 4, 4 / 6),  # the lowest threshold reaching 0.7: 0.8 (0.667) between does not matter
    (0.95, 0.9, 1.0, 1 / 6),
    (0.6, 0.0, 4 / 6, 1.0),  # answering everything reaches it: threshold 0, nothing abstains
    (0.75, 0.7, 3 / 4, 4 / 6),  # exactly the target counts
])
def test_fit_precision_point_estimate_by_hand(target, threshold, precision, coverage):
    got = thresholds.fit_precision(PROB, RIGHT, target, confidence=None)
    assert got["reached"] and got["threshold"] == threshold
    assert got["precision"] == pytest.approx(precision) and got["coverage"] == pytest.approx(coverage)


def test_unreachable_target_says_so():
    wrong_top = RIGHT.copy()
    wrong_top[1] = False  # the most probable winner is wrong: precisions 0, 1/3, 1/2, 2/5, 1/2
    got = thresholds.fit_precision(PROB, wrong_top, 0.95, confidence=None)
    assert not got["reached"] and got["threshold"] is None
    assert got["best_precision"] == pytest.approx(0.5) and got["best_coverage"] == 1.0  # at its largest coverage


def test_bound_rule_needs_more_than_the_point_estimate():
    """148 of 151 right (0.980) answering everything: the point estimate reaches 0.95, the 90 % lower bound
    (0.956) too, the 99 % one (0.945) not: then no threshold that answers fewer can be certified either (the
    wrong ones are the most confident), and the fit says how many more queries at that error rate would do."""
    prob = np.linspace(0.99, 0.5, 151)
    right = np.ones(151, bool)
    right[:3] = False
    at90 = thresholds.fit_precision(prob, right, 0.95, confidence=0.9)
    assert at90["reached"] and at90["threshold"] == 0.0 and at90["answered"] == 151
    assert at90["lower_bound"] == pytest.approx(0.9563, abs=1e-3) and at90["confidence"] == 0.9
    at99 = thresholds.fit_precision(prob, right, 0.95, confidence=0.99)
    assert not at99["reached"] and at99["best_lower_bound"] < 0.95
    more = at99["more_needed"]
    assert more > 0
    from qcls.heads.bounds import clopper_pearson_lower
    k = int((151 + more) * 148 / 151)  # the same share among 151 + more certifies; one fewer does not
    assert clopper_pearson_lower(k, 151 + more, 0.99) >= 0.95
    assert clopper_pearson_lower(int((150 + more) * 148 / 151), 150 + more, 0.99) < 0.95


def test_bound_rule_abstains_where_the_point_estimate_answers():
    """The hand-worked six: 0.9 answers one right query (point precision 1.0 ≥ 0.95), but one query cannot
    certify 0.95 at 90 %: the bound rule reaches nothing and reports the best bound (4 of 6 answering
    every query, above 1 of 1's 0.1)."""
    got = thresholds.fit_precision(PROB, RIGHT, 0.95)
    assert not got["reached"] and got["best_lower_bound"] == pytest.approx(0.3332, abs=1e-3)
    # only 0.9's all-right share could be certified: 45 answered of 45 (0.1 ** (1 / 45) ≥ 0.95), so 44 more at
    # its coverage of 1 in 6
    assert got["best_precision"] == pytest.approx(2 / 3) and got["more_needed"] == 44 * 6
    assert thresholds.fit_precision(PROB, RIGHT, 0.95, confidence=None)["reached"]


@pytest.mark.parametrize("target,threshold,coverage", [(0.5, 0.8, 0.5), (0.6, 0.7, 4 / 6), (1.0, 0.5, 1.0),
                                                       (0.1, 0.9, 1 / 6)])
def test_fit_coverage_by_hand(target, threshold, coverage):
    got = thresholds.fit_coverage(PROB, RIGHT, target)
    assert got["threshold"] == threshold and got["coverage"] == pytest.approx(coverage)


def test_summary_at_a_threshold():
    t = Threshold(0.7)
    got = thresholds.summary(thresholds.answered(PROB, ["x"] * 6, t), RIGHT)
    assert got == {"n": 6, "answered": 4, "coverage": 4 / 6, "precision": 0.75, "errors_avoided": 0.5}
    per_label = Threshold(0.7, {"y": 0.95})  # a winner `y` needs 0.95
    got = thresholds.summary(thresholds.answered(PROB, ["x", "y", "x", "x", "x", "x"], per_label), RIGHT)
    assert got["answered"] == 3 and got["precision"] == pytest.approx(2 / 3)


def test_parse_targets():
    assert thresholds.parse_targets(["0.95", "category=0.9"], ["category", "audience"], "--target-precision") == \
        {"category": 0.9, "audience": 0.95}
    assert thresholds.parse_targets(["audience=0.8"], ["category", "audience"], "--t") == {"audience": 0.8}
    with pytest.raises(ValueError, match="no prompt 'colour'"):
        thresholds.parse_targets(["colour=0.9"], ["category"], "--target-precision")
    with pytest.raises(ValueError, match=r"share in \(0, 1\]"):
        thresholds.parse_targets(["95"], ["category"], "--target-precision")


def _result(probs: dict[str, float]) -> PromptResult:
    best = max(probs, key=probs.get)
    return PromptResult("p", best, probs[best], [LabelScore(k, 0.0, v, 1) for k, v in probs.items()])


def test_apply_marks_abstention_and_keeps_every_probability():
    ph = PromptHead.temperature_bias(["a", "b", "none"], 1.0, [0, 0, 0])
    ph.threshold = Threshold(0.6, {"b": 0.5}, fallback="none")
    head = Head({"p": ph}, "temperature_bias")
    low, b_ok, high = _result({"a": 0.55, "b": 0.3, "none": 0.15}), _result({"a": 0.3, "b": 0.55, "none": 0.15}), \
        _result({"a": 0.7, "b": 0.2, "none": 0.1})
    thresholds.apply([low, b_ok, high], thresholds.limits_of(head, ["p"] * 3))
    assert (low.label, low.abstained, low.prob) == ("none", True, 0.55)
    assert [s.prob for s in low.labels] == [0.55, 0.3, 0.15]
    assert (b_ok.label, b_ok.abstained) == ("b", False)  # the per-label threshold of b
    assert (high.label, high.abstained) == ("a", False)
    ph.threshold = Threshold(0.6)
    r = _result({"a": 0.55, "b": 0.3, "none": 0.15})
    thresholds.apply([r], thresholds.limits_of(head, ["p"]))
    assert r.label is None and r.abstained
    assert pickle.loads(pickle.dumps(r)) == r  # a served result pickles with its mark


def test_head_file_round_trip_and_old_files(tmp_path):
    ph = PromptHead.temperature_bias(["a", "b"], 1.5, [0.2, -0.2])
    head = Head({"p": ph, "q": PromptHead.temperature_bias(["u", "v"], 1.0, [0.0, 0.0])}, "temperature_bias")
    path = tmp_path / "h.yaml"
    files.save(head, path)  # no thresholds: what older files hold
    assert "threshold" not in path.read_text() and files.load(path).prompts["p"].threshold is None
    ph.threshold = Threshold(0.8125, {"b": 0.9}, "none", {"target_precision": 0.95, "reached": True})
    files.save(head, path)
    back = files.load(path)
    assert back.prompts["p"].threshold == ph.threshold and back.prompts["q"].threshold is None
    assert back.prompts["p"].reorder(["b", "a"]).threshold == ph.threshold
    text = path.read_text().replace("b: 0.9", "c: 0.9")
    path.write_text(text)
    with pytest.raises(CalibrationError, match=r"threshold.labels names \['c'\]"):
        files.load(path)
    path.write_text(text.replace("c: 0.9", "b: 1.5"))
    with pytest.raises(CalibrationError, match="threshold"):
        files.load(path)


def test_classifier_results_abstain(tiny_dirs, tmp_path):
    """A calibration file with a threshold no winner reaches: every result abstains and keeps its probabilities;
    with the threshold at 0 none does."""
    from qcls.classifier import Classifier
    labels = ["man", "manager", "woman", "none"]
    path = tmp_path / "cal.yaml"
    ph = PromptHead.temperature_bias(labels, 1.0, [0.0] * 4)
    ph.threshold = Threshold(0.999, fallback="none")
    Head({"a": ph}, "temperature_bias").save(path)
    clf = Classifier(tiny_cfg(tiny_dirs["qwen3"], [prompt("a", labels)], calibration=str(path)))
    r = clf.classify(["red dress", "boots"])
    for q in r:
        p = q.prompts[0]
        assert p.abstained and p.label == "none" and p.prob == max(s.prob for s in p.labels) < 0.999
        assert sum(s.prob for s in p.labels) == pytest.approx(1.0)
        assert q.to_dict()["prompts"][0]["abstained"] is True
    ph.threshold = Threshold(0.0)
    Head({"a": ph}, "temperature_bias").save(path)
    clf = Classifier(tiny_cfg(tiny_dirs["qwen3"], [prompt("a", labels)], calibration=str(path)), loaded=clf.loaded)
    assert not any(p.abstained for q in clf.classify(["red dress"]) for p in q.prompts)


def test_described_says_the_promise():
    t = Threshold(0.587, fitted={"target_precision": 0.95, "confidence": 0.9, "lower_bound": 0.9531, "answered": 123,
                                 "n": 151})
    assert thresholds.described(t) == ("≥ 0.5870 (precision ≥ 0.95 certified at 90% confidence: lower bound 0.953 on "
                                       "123 answered of n=151)")
    assert "no confidence bound" in thresholds.described(Threshold(0.5, fitted={"target_precision": 0.95, "n": 9}))
