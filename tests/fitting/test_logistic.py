"""The heads' logistic regression (qcls/fitting/logistic.py) is scikit-learn's LogisticRegression(C) solved to its
optimum: on random problems of several shapes (fewer rows than features and more, two labels and many, weak and
strong penalties, a sparse TF-IDF matrix) its probabilities, winners and weights equal those of scikit-learn run
to convergence (newton-cg at a tolerance of 1e-10), its objective is never above the one scikit-learn's default
stopping reaches, and the cross-validation picks the same C from the same held-out log-losses as a
cross-validation written with scikit-learn; on the demo model's states, the same read and C per prompt."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from qcls.fitting import heads as H
from qcls.fitting import logistic

SHAPES = [  # n rows, d features, labels, C
    (40, 300, 5, 10.0), (40, 300, 3, 1e-3), (60, 1280, 5, 100.0), (30, 50, 2, 3.16), (200, 20, 7, 1.0),
    (150, 12, 2, 100.0), (90, 640, 10, 0.316),
]


def problem(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x [n, d], y [n], held-out x [20, d]): labels with shifted means, features of very different scales."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    centres = rng.normal(size=(k, d))
    scale = np.exp(rng.normal(size=d))
    x = (rng.normal(size=(n, d)) + centres[y]) * scale + 3.0
    held = (rng.normal(size=(20, d)) + centres[rng.integers(0, k, 20)]) * scale + 3.0
    return x, y, held


def reference(C: float, tight: bool = True):
    from sklearn.linear_model import LogisticRegression
    return LogisticRegression(C=C, solver="newton-cg", tol=1e-10, max_iter=10_000) if tight else \
        LogisticRegression(C=C, max_iter=2000)


def probs(f: H.Fitted, x: np.ndarray) -> np.ndarray:
    z = np.asarray(x @ f.weights.T) + f.bias
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def objective(f: H.Fitted, x: np.ndarray, y: np.ndarray, C: float) -> float:
    """C Σ cross-entropy + ½‖W‖² on the standardised features, as scikit-learn states it (binary: one vector)."""
    from sklearn.preprocessing import StandardScaler
    s = StandardScaler().fit(x)
    w = f.weights * s.scale_  # the weights on the standardised features
    ce = -np.log(probs(f, x)[np.arange(len(y)), y]).sum()
    return C * ce + 0.5 * (np.sum((w[1] - w[0]) ** 2) if len(w) == 2 else np.sum(w * w))


@pytest.mark.parametrize("n,d,k,C", SHAPES)
def test_the_optimum_equals_sklearn_run_to_convergence(n, d, k, C):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    x, y, held = problem(n, d, k, seed=n + d + k)
    f = H.fit_affine(x, y, k, C)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = make_pipeline(StandardScaler(), reference(C)).fit(x, y)
        default = make_pipeline(StandardScaler(), reference(C, tight=False)).fit(x, y)
    for rows in (x, held):
        assert np.abs(probs(f, rows) - ref.predict_proba(rows)).max() < 1e-7
        assert np.array_equal(probs(f, rows).argmax(1), ref.predict(rows))
    want, default = as_fitted(ref, k, C), as_fitted(default, k, C)
    assert np.abs(f.weights - want.weights).max() < 1e-6 * np.abs(want.weights).max()
    assert np.abs(f.bias - want.bias).max() < 1e-5 * max(1.0, np.abs(want.bias).max())
    assert objective(f, x, y, C) <= objective(default, x, y, C) + 1e-9 * C * n


def as_fitted(pipe, k: int, C: float) -> H.Fitted:
    """A scikit-learn StandardScaler + LogisticRegression pipeline as the affine map of the raw features that
    fit_affine returns (two labels: rows −coef/2, coef/2; the biases centred as they come)."""
    scaler, lr = pipe[0], pipe[-1]
    coef, icpt = lr.coef_, lr.intercept_
    if k == 2:
        coef, icpt = np.vstack([-coef / 2, coef / 2]), np.array([-icpt[0] / 2, icpt[0] / 2])
    w = coef / scaler.scale_
    return H.Fitted(w, icpt - w @ scaler.mean_, C)


def test_a_sparse_matrix_unstandardised_equals_sklearn():
    """The TF-IDF baseline's case: a scipy sparse matrix, fitted as it is."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    rng = np.random.default_rng(5)
    words = ["red", "dress", "cheap", "jeans", "shoe", "luxury", "silk", "boots", "sale", "连衣裙", "裤子"]
    queries = [" ".join(rng.choice(words, size=rng.integers(1, 4))) + f" {i}" for i in range(45)]
    y = np.arange(45) % 3
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(1, 3), sublinear_tf=True).fit(queries)
    x = vec.transform(queries)
    for C in (0.01, 31.6):
        f = H.fit_affine(x, y, 3, C, standardise=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = reference(C).fit(x, y)
        assert np.abs(probs(f, x) - ref.predict_proba(x)).max() < 1e-6


def test_a_label_missing_from_the_rows_and_the_binary_rows_keep_their_places():
    x, y, held = problem(60, 30, 4, seed=2)
    y = np.where(y == 1, 3, y)  # labels 0, 2, 3 of 5: labels 1 and 4 absent
    f = H.fit_affine(x, y, 5, 1.0)
    assert (f.bias[[1, 4]] == H.ABSENT).all() and not f.weights[[1, 4]].any()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        ref = make_pipeline(StandardScaler(), reference(1.0)).fit(x, y)
    assert np.abs(probs(f, held)[:, [0, 2, 3]] - ref.predict_proba(held)).max() < 1e-6
    with pytest.raises(ValueError, match="at least two labels"):
        logistic.solve(np.ones((4, 2)), np.zeros(4, dtype=int), 1.0)


def sklearn_cross_validate(x: np.ndarray, y: np.ndarray, n_labels: int, Cs, folds: int, seed: int = 0) -> dict:
    """The cross-validation of qcls/fitting/heads.py written with scikit-learn's LogisticRegression (to
    convergence), each fit from zero: per C the pooled held-out log-loss and accuracy."""
    from sklearn.model_selection import StratifiedKFold
    from sklearn.preprocessing import StandardScaler
    loss, hit = {C: [] for C in Cs}, {C: [] for C in Cs}
    for tr, te in StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros(len(y)), y):
        s = StandardScaler().fit(x[tr])
        for C in Cs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lr = reference(C).fit(s.transform(x[tr]), y[tr])
            logp = np.full((len(te), n_labels), -np.inf)
            logp[:, lr.classes_] = lr.predict_log_proba(s.transform(x[te]))
            loss[C].append(-logp[np.arange(len(te)), y[te]])
            hit[C].append(logp.argmax(1) == y[te])
    return {C: (float(np.mean(np.concatenate(loss[C]))), float(np.mean(np.concatenate(hit[C])))) for C in Cs}


@pytest.mark.parametrize("n,d,k", [(45, 200, 3), (60, 40, 5), (36, 500, 2)])
def test_cross_validation_equals_sklearn_and_picks_the_same_C(n, d, k):
    x, y, _ = problem(n, d, k, seed=7 * n + d)
    x[:, : d // 2] = np.random.default_rng(n).normal(size=(n, d // 2))  # half noise: the strength matters
    got = H.cross_validate(x, y, k, H.CS, 3)
    want = sklearn_cross_validate(x, y, k, H.CS, 3)
    for C in H.CS:
        assert got[C]["log_loss"] == pytest.approx(want[C][0], rel=1e-6, abs=1e-9)
        assert got[C]["accuracy"] == want[C][1]
    assert H.best_C(got) == min(want, key=lambda c: (want[c][0], -c))


@pytest.mark.slow
def test_on_the_demo_models_states_the_same_read_and_C_as_sklearn(demo_classifier):
    """The SmolLM2 demo's states of the shipped dev split's queries, two candidate reads per prompt, three
    strengths: every read's cross-validated log-loss, accuracy and C equal the scikit-learn cross-validation's,
    and so does the read chosen."""
    from qcls.classifier import Classifier
    from qcls.config.paths import find_file
    from qcls.eval.dataset import EvalSet, load_eval_set
    from qcls.fitting.head_depth import most_accurate
    from qcls.fitting.head_fitting import read_set
    from qcls.heads.head import Read
    reads = [Read(8, "position"), Read(20, "query_mean")]
    CS = H.CS[::5]  # 0.001, 0.316, 100: scikit-learn run to convergence on these is slow
    taps = H.taps_of(reads)
    clf = Classifier(demo_classifier.cfg.model_copy(update={"calibration": None}), loaded=demo_classifier.loaded,
                     taps=taps)
    data = load_eval_set(find_file("data/eval/ecommerce_dev.jsonl"), clf.cfg.prompts)
    fits = [e for e in data.examples  # the queries within the fixture's max_query_tokens
            if len(clf.tokenizer.encode(e.query, add_special_tokens=False)) <= clf.cfg.max_query_tokens]
    data = EvalSet(data.path, fits[:60])  # the forward over them is most of this test's time
    for name, ss in read_set(clf, data).items():
        states, scores, gold = ss.labelled()
        tried = H.cv_reads(states, taps, scores, gold, len(ss.labels), reads, False, Cs=CS)
        want = []
        for read, got in zip(reads, tried):
            cv = sklearn_cross_validate(H.features(states, taps, read, None), gold, len(ss.labels), CS, 3)
            C = min(cv, key=lambda c: (cv[c][0], -c))
            assert got.C == C and got.log_loss == pytest.approx(cv[C][0], rel=1e-6) and got.accuracy == cv[C][1]
            want.append((read, cv[C][0]))
        assert most_accurate(tried).read == min(want, key=lambda r: r[1])[0], name
