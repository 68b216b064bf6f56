"""Fitting learned heads (docs/design.md §10): per prompt, a multinomial logistic regression with an L2 penalty on
the hidden state the engine reads (optionally with the prompt's raw label scores appended; solved to its optimum:
qcls/fitting/logistic.py), its strength chosen by stratified k-fold cross-validation on the fitting split alone
(scikit-learn's folds and scaling).

Features are standardised inside the fit and the scaling is folded back into the weights, so what is saved is
one affine map of the raw state, the form the engine's tail evaluates (qcls/heads/head.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from qcls.errors import ConfigError, missing_package
from qcls.fitting import logistic
from qcls.fitting.head_depth import ReadCV, most_accurate
from qcls.heads.head import PromptHead, Read, Tap

CS = tuple(float(c) for c in np.logspace(-3, 2, 11))  # L2 strengths tried: C = 1/λ, half a decade apart
FOLDS = 3
ABSENT = -1e4  # the bias of a label that a learning-curve subset lacks: it can never win


class FitError(ConfigError):
    """A fitting split a head cannot be fitted on; the message names the prompt, the label and what is needed."""


def _sklearn():
    try:
        from sklearn.model_selection import StratifiedKFold
        from sklearn.preprocessing import StandardScaler
    except ImportError as e:
        raise missing_package(e, "fitting a head (qcls calibrate --method head)") or e
    return StratifiedKFold, StandardScaler


def one_thread():
    """BLAS on one thread while fitting: these problems are small, and a BLAS pool per fit fighting torch's
    threads made each fit 100× slower on a busy 2-core machine. Entered once around a whole set of fits: each
    entry looks the loaded libraries up again (milliseconds)."""
    from threadpoolctl import threadpool_limits
    return threadpool_limits(1)


def check_split(gold: np.ndarray, labels: Sequence[str], folds: int, prompt: str, where: str) -> None:
    """Refuse a fitting split on which a head cannot be fitted: a label that never occurs (the head could
    never predict it) or fewer examples of a label than the folds of the cross-validation."""
    counts = np.bincount(gold, minlength=len(labels))
    never = [lab for lab, c in zip(labels, counts) if c == 0]
    if never:
        raise FitError(f"{where}: prompt {prompt!r}: labels {never} never occur among its "
                       f"{len(gold)} labelled queries, so a head could never predict them",
                       f"label at least {folds} queries with each of them, or drop them from the prompt's labels")
    few = [(lab, int(c)) for lab, c in zip(labels, counts) if c < folds]
    if few:
        shown = ", ".join(f"{lab!r} has {c}" for lab, c in few)
        raise FitError(f"{where}: prompt {prompt!r}: {folds}-fold cross-validation (to choose the L2 strength) "
                       f"needs at least {folds} examples of every label; {shown}",
                       f"label more queries, or lower the folds with --cv-folds {max(2, min(c for _, c in few))} "
                       "(at least 2)" if min(c for _, c in few) >= 2 else "label more queries (each label needs "
                       "at least 2 examples even with --cv-folds 2)")


def features(states: np.ndarray, taps: list[Tap], read: Read, scores: np.ndarray | None) -> np.ndarray:
    """[n, F]: the read's taps of `states` [n, taps, H] concatenated in the read's order, then the raw scores."""
    parts = [states[:, taps.index(t)] for t in read.taps]
    if scores is not None:
        parts.append(scores)
    return np.concatenate(parts, axis=1).astype(np.float64)


@dataclass
class Fitted:
    weights: np.ndarray  # [L, F] on the raw (unstandardised) features
    bias: np.ndarray  # [L]
    C: float


def fit_affine(x, y: np.ndarray, n_labels: int, C: float, standardise: bool = True) -> Fitted:
    """Standardise, fit the L2 logistic regression, fold the scaling back: logits = W x + c for every label
    (a label absent from y gets zero weights and a bias it can never win with). `standardise=False` fits on x as
    it is (a sparse TF-IDF matrix: qcls/fitting/baseline.py)."""
    present = np.unique(y)
    if len(present) == 1:  # nothing to separate (a small learning-curve subset): that label, always
        c = np.full(n_labels, ABSENT)
        c[present[0]] = 0.0
        return Fitted(np.zeros((n_labels, x.shape[1])), c, C)
    mean, scale = _scaling(x) if standardise else (np.zeros(x.shape[1]), np.ones(x.shape[1]))
    with one_thread():
        span = logistic.Span((x - mean) / scale if standardise else x)
        sol = logistic.solve(span.coords, y, C)
    coef = span.weights(sol.theta) / scale
    w = np.zeros((n_labels, x.shape[1]))
    c = np.full(n_labels, ABSENT)
    w[sol.classes] = coef
    c[sol.classes] = sol.bias - coef @ mean
    return Fitted(w, c, C)


def _scaling(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's StandardScaler fitted on x: (mean, scale), a feature without spread scaled by 1."""
    s = _sklearn()[1]().fit(x)
    return s.mean_, s.scale_


def cross_validate(x, y: np.ndarray, n_labels: int, Cs: Sequence[float], folds: int,
                   seed: int = 0, standardise: bool = True) -> dict[float, dict[str, float]]:
    """Per C: mean held-out log-loss, accuracy and macro-F1 (of the pooled held-out winners) over stratified
    folds of (x, y), and each fold's mean log-loss (`fold_log_loss`: the one-SE rule's standard error,
    qcls/fitting/head_depth.py). Each fold walks the Cs from the strongest penalty up, starting every solve from
    the previous optimum (the same optimum, fewer steps). `standardise=False` fits on x as it is (a sparse TF-IDF
    matrix: qcls/fitting/baseline.py)."""
    from qcls.eval.metrics import macro_f1
    StratifiedKFold, _ = _sklearn()
    losses: dict[float, list] = {C: [] for C in Cs}
    preds: dict[float, list] = {C: [] for C in Cs}
    golds = []
    for tr, te in StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros(len(y)), y):
        golds.append(y[te])
        if standardise:
            mean, scale = _scaling(x[tr])
            xtr, xte = (x[tr] - mean) / scale, (x[te] - mean) / scale
        else:
            xtr, xte = x[tr], x[te]
        span = logistic.Span(xtr)
        coords = span.of(xte)
        sol = None
        for C in sorted(Cs):
            sol = logistic.solve(span.coords, y[tr], C, sol)
            logp = np.full((len(te), n_labels), -np.inf)
            logp[:, sol.classes] = sol.log_proba(coords)
            losses[C].append(-logp[np.arange(len(te)), y[te]])
            preds[C].append(logp.argmax(1))
    gold = np.concatenate(golds)
    return {C: {"log_loss": float(np.mean(np.concatenate(losses[C]))),
                "accuracy": float(np.mean(np.concatenate(preds[C]) == gold)),
                "macro_f1": macro_f1(np.concatenate(preds[C]), gold, n_labels),
                "fold_log_loss": [float(np.mean(f)) for f in losses[C]]} for C in Cs}


def best_C(cv: dict[float, dict[str, float]]) -> float:
    """The L2 strength with the lowest held-out log-loss (the weaker penalty on a tie)."""
    return min(cv, key=lambda c: (cv[c]["log_loss"], -c))


def cv_reads(states: np.ndarray, taps: list[Tap], scores: np.ndarray, gold: np.ndarray, n_labels: int,
             reads: Sequence[Read], with_scores: bool, *, Cs: Sequence[float] = CS, folds: int = FOLDS,
             seed: int = 0) -> list[ReadCV]:
    """Every candidate read of one prompt cross-validated on (states, gold), each at its best C: the table the
    depth rule chooses from (qcls/fitting/head_depth.py). `states` [n, taps, H], `scores` [n, L] raw, `gold` [n]."""
    out = []
    with one_thread():
        for read in reads:
            cv = cross_validate(features(states, taps, read, scores if with_scores else None), gold, n_labels, Cs,
                                folds, seed)
            C = best_C(cv)
            out.append(ReadCV.from_folds(read, C, cv[C]["log_loss"], cv[C]["fold_log_loss"], cv[C]["accuracy"]))
    return out


def fit_read(states: np.ndarray, taps: list[Tap], scores: np.ndarray, gold: np.ndarray, labels: list[str],
             chosen: ReadCV, tried: Sequence[ReadCV], with_scores: bool, folds: int) -> PromptHead:
    """The head of one prompt on the chosen read and C, refitted on every fitting query, with its statistics."""
    x = features(states, taps, chosen.read, scores if with_scores else None)
    f = fit_affine(x, gold, len(labels), chosen.C)
    n_state = x.shape[1] - (len(labels) if with_scores else 0)
    info = {"n": int(len(gold)), "C": chosen.C, "cv_folds": folds, "cv_accuracy": round(chosen.accuracy, 4),
            "cv_log_loss": round(chosen.log_loss, 4), "cv_log_loss_se": round(chosen.se, 4),
            "fit_accuracy": round(float(np.mean((x @ f.weights.T + f.bias).argmax(1) == gold)), 4)}
    if len(tried) > 1:
        info["reads_tried"] = {r.name: {"C": r.C, "cv_accuracy": round(r.accuracy, 4),
                                        "cv_log_loss": round(r.log_loss, 4), "cv_log_loss_se": round(r.se, 4)}
                               for r in tried}
    return PromptHead(list(labels), f.bias, f.weights[:, n_state:] if with_scores else None, f.weights[:, :n_state],
                      chosen.read, info)


def fit_prompt(states: np.ndarray, taps: list[Tap], scores: np.ndarray, gold: np.ndarray, labels: list[str],
               reads: Sequence[Read], with_scores: bool, *, Cs: Sequence[float] = CS, folds: int = FOLDS,
               seed: int = 0) -> PromptHead:
    """The head of one prompt alone: the candidate read with the lowest held-out log-loss, whatever its depth
    (a prompt set chooses its reads together: qcls/fitting/head_fitting.py)."""
    tried = cv_reads(states, taps, scores, gold, len(labels), reads, with_scores, Cs=Cs, folds=folds, seed=seed)
    return fit_read(states, taps, scores, gold, labels, most_accurate(tried), tried, with_scores, folds)


def learning_curve(fit_x: np.ndarray, fit_y: np.ndarray, eval_x: np.ndarray, eval_y: np.ndarray, n_labels: int,
                   C: float, sizes: Sequence[int], draws: int, seed: int = 0) -> dict[int, list[float]]:
    """Held-out accuracy of heads fitted on random subsets of the fitting queries: per size, one accuracy per
    draw. Subsets depend only on (seed, size, draw) and the fitting set's order, so every configuration
    compared on the same split sees the same subsets; the L2 strength is the one chosen on all fitting queries
    (a subset of 25 cannot be cross-validated). A subset may lack a label; its head then never predicts it."""
    out: dict[int, list[float]] = {}
    for size in sizes:
        if size >= len(fit_y):
            continue
        accs = []
        for d in range(draws):
            pick = np.random.default_rng([seed, size, d]).permutation(len(fit_y))[:size]
            f = fit_affine(fit_x[pick], fit_y[pick], n_labels, C)
            accs.append(float(np.mean((eval_x @ f.weights.T + f.bias).argmax(1) == eval_y)))
        out[size] = accs
    full = fit_affine(fit_x, fit_y, n_labels, C)
    out[len(fit_y)] = [float(np.mean((eval_x @ full.weights.T + full.bias).argmax(1) == eval_y))]
    return out


def candidate_reads(layer: str, read: str, num_layers: int) -> list[Read]:
    """The reads `--layer` / `--read` ask for: one, or with `auto` the final state and about 15 layers spread
    over the depth (every layer of a model of ≤ 16) and/or every kind, to be chosen per prompt by
    cross-validation on the fitting split."""
    if layer not in ("auto", "final") and not (layer.isdigit() and 1 <= int(layer) < num_layers):
        raise FitError(f"--layer {layer}: this model has {num_layers} decoder layers, and a head reads the stream "
                       f"after 1 … {num_layers - 1} of them or the final state",
                       f"give --layer N with 1 ≤ N ≤ {num_layers - 1}, --layer final or --layer auto")
    step = max(1, round(num_layers / 15))
    layers: list[int | str] = ["final", *range(step, num_layers, step)] if layer == "auto" else \
        ["final" if layer == "final" else int(layer)]
    kinds = ["position", "query_mean", "both"] if read == "auto" else [read]
    out = [Read(lay, k) for lay in layers for k in kinds if not (lay == "final" and k != "position")]
    if not out:
        raise FitError(f"--layer {layer} --read {read}: the mean over the query's tokens needs an intermediate "
                       "layer", "give --layer N (1 … number of layers − 1) or --read position")
    return out


def taps_of(reads: Sequence[Read]) -> list[Tap]:
    return list(dict.fromkeys(t for r in reads for t in r.taps))
