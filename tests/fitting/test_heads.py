"""Fitting heads (qcls/fitting/heads.py): the folded affine map equals scikit-learn's own pipeline (run to
convergence; the solver itself: tests/fitting/test_logistic.py), the
cross-validation picks the strength by held-out log-loss, refusals of splits a head cannot be fitted on, and
the learning curve's numbers recomputed by hand on a toy set."""
from __future__ import annotations

import numpy as np
import pytest

from qcls.fitting import heads as H
from qcls.fitting.head_fitting import StateSet, curve
from qcls.heads.head import Head, PromptHead, Read, Tap


def blobs(n_per: int, centres: list[list[float]], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(c, 1.0, size=(n_per, len(c))) for c in centres])
    y = np.repeat(np.arange(len(centres)), n_per)
    return x * np.array([1.0, 100.0, 0.01][:x.shape[1]]) + 5.0, y  # scales far apart: the scaler matters


def test_folded_weights_equal_sklearn_pipeline():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    for centres in ([[0, 0, 0], [2, 1, 0], [0, 2, 2]], [[0, 0, 0], [1, 1, 1]]):  # 3 classes, and the binary case
        x, y = blobs(20, centres)
        f = H.fit_affine(x, y, len(centres), C=0.3)
        pipe = make_pipeline(StandardScaler(), LogisticRegression(C=0.3, solver="newton-cg", tol=1e-10,
                                                                  max_iter=10_000)).fit(x, y)  # to convergence
        logits = x @ f.weights.T + f.bias
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        assert np.abs(p - pipe.predict_proba(x)).max() < 1e-6


def test_absent_label_never_wins():
    x, y = blobs(10, [[0, 0, 0], [3, 3, 3]])
    f = H.fit_affine(x, y, 3, C=1.0)  # label 2 has no example
    assert (f.weights[2] == 0).all() and f.bias[2] == H.ABSENT
    assert ((x @ f.weights.T + f.bias).argmax(1) != 2).all()


def test_cross_validation_prefers_the_lower_held_out_log_loss():
    x, y = blobs(15, [[0, 0, 0], [1.5, 1.5, 1.5], [3, 0, 3]], seed=3)
    states = x[:, None, :]
    ph = H.fit_prompt(states, [Tap(1, "position")], np.zeros((len(y), 3)), y, ["a", "b", "c"],
                      [Read(1, "position")], False, Cs=(1e-4, 1.0), folds=3)
    cv = H.cross_validate(x, y, 3, (1e-4, 1.0), 3)
    best = min(cv, key=lambda c: cv[c]["log_loss"])
    assert ph.info["C"] == best and ph.info["cv_accuracy"] == round(cv[best]["accuracy"], 4)
    assert cv[1.0]["log_loss"] < cv[1e-4]["log_loss"]  # separable blobs: a weak penalty wins
    assert ph.score_weights is None and ph.feature_weights.shape == (3, 3)


def test_candidate_reads_pick_per_prompt():
    """With two candidate reads, the one whose tap carries the labels is chosen."""
    x, y = blobs(12, [[0, 0, 0], [3, 3, 3]], seed=1)
    noise = np.random.default_rng(9).normal(size=x.shape)
    states = np.stack([noise, x], axis=1)  # tap 0: noise, tap 1: the signal
    taps = [Tap(2, "position"), Tap(4, "position")]
    ph = H.fit_prompt(states, taps, np.zeros((len(y), 2)), y, ["a", "b"], [Read(2), Read(4)], False,
                      Cs=(0.1, 1.0), folds=3)
    assert ph.read == Read(4) and set(ph.info["reads_tried"]) == {"position@2", "position@4"}


@pytest.mark.parametrize("counts,folds,match", [
    ([5, 0, 4], 3, r"(?s)labels \['b'\] never occur .*label at least 3 queries with each of them"),
    ([5, 2, 4], 3, r"(?s)3-fold cross-validation .* needs at least 3 examples of every label; 'b' has 2.*"
                   r"--cv-folds 2"),
    ([5, 1, 4], 2, r"(?s)'b' has 1.*each label needs at least 2 examples even with --cv-folds 2"),
])
def test_splits_a_head_cannot_be_fitted_on_are_refused(counts, folds, match):
    gold = np.repeat(np.arange(3), counts)
    with pytest.raises(H.FitError, match=match):
        H.check_split(gold, ["a", "b", "c"], folds, "p", "dev.jsonl")


def test_learning_curve_numbers_by_hand():
    """A toy set where each head's held-out accuracy is known without fitting: the label is the sign of one
    feature, so a head fitted on a subset holding both labels classifies the held-out set perfectly, and one
    fitted on a single label predicts it everywhere (accuracy = that label's share). The subsets are the
    documented ones: np.random.default_rng([seed, size, draw]).permutation(n)[:size]."""
    fit_y = np.array([0] * 3 + [1] * 17)  # label 0 is rare: small subsets often miss it
    fit_x = np.where(fit_y == 0, -1.0, 1.0)[:, None] * np.arange(1, 21)[:, None] / 10
    ev_y = np.array([0, 0, 0, 1])
    ev_x = np.array([[-1.0], [-0.5], [-2.0], [1.5]])
    got = H.learning_curve(fit_x, fit_y, ev_x, ev_y, 2, C=1.0, sizes=[2, 5, 30], draws=4, seed=7)
    want = {}
    for size in (2, 5):
        accs = []
        for d in range(4):
            labels = set(fit_y[np.random.default_rng([7, size, d]).permutation(20)[:size]])
            accs.append(1.0 if labels == {0, 1} else float(np.mean(ev_y == labels.pop())))
        want[size] = accs
    want[20] = [1.0]  # all fitting queries; a size above the set's size is skipped
    assert got == want
    assert any(a < 1.0 for a in want[2])  # the toy does exercise a one-label subset


def test_curve_means_over_prompts():
    fit_y = np.array([0, 1] * 10)
    fit_s = np.where(fit_y == 0, -1.0, 1.0)[:, None, None] * np.ones((20, 1, 2))
    ev_y = np.array([0, 1, 1, 1])
    ev_s = np.where(ev_y == 0, -1.0, 1.0)[:, None, None] * np.ones((4, 1, 2))
    tap = [Tap(1, "position")]
    ph = PromptHead(["a", "b"], np.zeros(2), None, np.zeros((2, 2)), Read(1), {"C": 1.0})
    flipped_eval = StateSet(["a", "b"], -ev_s, np.zeros((4, 2)), ev_y)  # states mirrored: every head is wrong
    head = Head({"p": ph, "q": ph}, "head")
    sets_fit = {"p": StateSet(["a", "b"], fit_s, np.zeros((20, 2)), fit_y),
                "q": StateSet(["a", "b"], fit_s, np.zeros((20, 2)), fit_y)}
    got = curve(head, sets_fit, {"p": StateSet(["a", "b"], ev_s, np.zeros((4, 2)), ev_y), "q": flipped_eval}, tap,
                [10], 2)
    assert got["sizes"] == ["10", "all"]
    assert got["per_prompt"]["p"]["all"] == [1.0] and got["per_prompt"]["q"]["all"] == [0.0]
    assert got["mean_accuracy"]["all"] == 0.5 and got["mean_accuracy"]["10"] == 0.5
