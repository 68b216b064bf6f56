"""The cheap baselines every evaluation prints beside the LLM: the majority class and a character n-gram TF-IDF
+ logistic regression per prompt (scikit-learn's features; the heads' regression, qcls/fitting/logistic.py), both
fitted on the fitting split alone.

The TF-IDF features are sklearn's TfidfVectorizer(analyzer="char_wb", ngram_range=(1, 3), sublinear_tf=True):
n-grams of each whitespace-separated word padded with one space (so Chinese queries without spaces give
their character n-grams), lowercased, tf → 1 + ln(tf), idf = ln((1 + n) / (1 + df)) + 1, each row scaled to
unit L2 norm. The vocabulary and idf come from the fitting queries. The L2 strength C is chosen exactly as a
learned head's (qcls/fitting/heads.py: the same grid, the same stratified folds and seed, the lowest held-out
log-loss), on the raw TF-IDF values (no standardisation: a sparse matrix).

With a scored split (a sweep job with eval.fit_on) the model is refitted on the whole fitting split and scored
there; without one (`qcls calibrate`, a sweep job without fit_on) the numbers are the cross-validated ones on
the split itself, comparable to a head's cv_accuracy (the same folds). Accuracy and macro-F1 are
qcls.eval.metrics' (macro-F1 over the labels predicted or gold at least once).
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from qcls.fitting import heads as H
from qcls.eval import metrics
from qcls.eval.dataset import EvalSet

NGRAMS = (1, 3)
METHOD = "character n-gram TF-IDF (char_wb, n=1-3, sublinear tf) + L2 logistic regression"
KEYS = ("accuracy", "macro_f1", "majority_accuracy", "majority_macro_f1")
_cache: dict[tuple, dict[str, Any]] = {}


def vectorizer():
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
    except ImportError as e:
        from qcls.errors import missing_package
        raise missing_package(e, "the TF-IDF baseline") or e
    return TfidfVectorizer(analyzer="char_wb", ngram_range=NGRAMS, sublinear_tf=True, lowercase=True)


def pairs(data: EvalSet, spec) -> tuple[list[str], np.ndarray]:
    """(queries, gold label indices) of the examples with a gold label for this prompt."""
    rows = [(e.query, spec.labels.index(e.labels[spec.name])) for e in data.examples if spec.name in e.labels]
    return [q for q, _ in rows], np.array([y for _, y in rows], dtype=np.int64)


def prompt_baseline(fit_q: Sequence[str], fit_y: np.ndarray, labels: Sequence[str],
                    eval_q: Sequence[str] | None = None, eval_y: np.ndarray | None = None, *, folds: int = H.FOLDS,
                    Cs: Sequence[float] = H.CS, seed: int = 0) -> dict[str, Any]:
    """One prompt's majority class and TF-IDF + logistic regression: fitted on (fit_q, fit_y), scored on
    (eval_q, eval_y), or cross-validated on the fitting split when there is no scored split."""
    n_labels = len(labels)
    fit_y = np.asarray(fit_y, dtype=np.int64)
    if len(np.unique(fit_y)) < 2:
        return {"n_fit": int(len(fit_y)), "error": "the fitting split has fewer than two distinct gold labels"}
    vec = vectorizer().fit(fit_q)
    x = vec.transform(fit_q)
    with warnings.catch_warnings(), H.one_thread():
        warnings.simplefilter("ignore")  # a label with fewer examples than folds: sklearn warns, the CV still runs
        cv = H.cross_validate(x, fit_y, n_labels, Cs, folds, seed, standardise=False)
    C = H.best_C(cv)
    majority = int(np.bincount(fit_y, minlength=n_labels).argmax())  # the first most frequent label on a tie
    out: dict[str, Any] = {"n_fit": int(len(fit_y)), "C": C, "cv_accuracy": cv[C]["accuracy"],
                           "cv_macro_f1": cv[C]["macro_f1"], "majority_label": labels[majority],
                           "features": len(vec.vocabulary_)}
    if eval_q is None:
        y, pred = fit_y, None
        out.update(n=int(len(y)), accuracy=cv[C]["accuracy"], macro_f1=cv[C]["macro_f1"], scored="cross-validated")
    else:
        y = np.asarray(eval_y, dtype=np.int64)
        f = H.fit_affine(x, fit_y, n_labels, C, standardise=False)
        pred = np.asarray(vec.transform(eval_q) @ f.weights.T + f.bias).argmax(1)
        out.update(n=int(len(y)), accuracy=metrics.accuracy(pred, y), macro_f1=metrics.macro_f1(pred, y, n_labels),
                   scored="held out")
    if len(y):
        maj = np.full(len(y), majority)
        out.update(majority_accuracy=metrics.accuracy(maj, y), majority_macro_f1=metrics.macro_f1(maj, y, n_labels))
    return out


def block(prompts, scored: EvalSet, fit: EvalSet | None = None, folds: int = H.FOLDS) -> dict[str, Any]:
    """The result's `baseline` block: per prompt (fitted on `fit`, scored on `scored`; without `fit`,
    cross-validated on `scored`) and the unweighted mean over prompts."""
    per = {}
    for spec in prompts:
        sq, sy = pairs(scored, spec)
        key = (tuple(sq), tuple(sy), spec.name, tuple(spec.labels), folds)
        if fit is not None:
            key += tuple(map(tuple, pairs(fit, spec)))
        if key not in _cache:  # a sweep's jobs share their splits: the baseline does not depend on the LLM
            try:
                _cache[key] = _one(spec, sq, sy, fit, folds)
            except ValueError as e:  # a split sklearn cannot cross-validate: recorded, the evaluation goes on
                _cache[key] = {"n": int(len(sy)), "error": f"not fitted: {e}"}
        per[spec.name] = dict(_cache[key])
    source = (f"fitted on {fit.path}, scored on {scored.path}" if fit is not None
              else f"{folds}-fold cross-validated on {scored.path}")
    return {"method": METHOD, "source": source, "folds": folds, "per_prompt": per,
            "mean": metrics.mean_over_prompts(per, KEYS)}


def _one(spec, sq: list[str], sy: np.ndarray, fit: EvalSet | None, folds: int) -> dict[str, Any]:
    if fit is None:
        return prompt_baseline(sq, sy, spec.labels, folds=folds) if len(sy) else {"n": 0}
    fq, fy = pairs(fit, spec)
    if not len(fy):
        return {"n": int(len(sy)), "n_fit": 0, "error": "no labelled query in the fitting split"}
    return prompt_baseline(fq, fy, spec.labels, sq, sy, folds=folds)


def table(b: dict[str, Any], llm: dict[str, float] | None = None, llm_name: str = "LLM") -> list[str]:
    """Text lines: per prompt majority and TF-IDF accuracy / macro-F1 (and the LLM's accuracy to compare)."""
    head = ["prompt", "n", "majority acc", "TF-IDF acc", "TF-IDF macro-F1", "C"] + ([f"{llm_name} acc"] if llm else [])
    rows = []
    for p, v in b["per_prompt"].items():
        if "error" in v or not v.get("n"):
            rows.append([p, str(v.get("n", 0)), "-", "-", "-", v.get("error", "no labelled query")]
                        + [""] * (len(head) - 6))
            continue
        rows.append([p, str(v["n"]), f"{v['majority_accuracy']:.3f}", f"{v['accuracy']:.3f}", f"{v['macro_f1']:.3f}",
                     f"{v['C']:.3g}"] + ([f"{llm[p]:.3f}" if llm.get(p) is not None else "-"] if llm else []))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    return [f"baselines ({b['method']}; {b['source']}):"] + \
        ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
