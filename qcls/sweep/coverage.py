"""What abstaining costs and buys, on the scored (test) split: per prompt the precision–coverage curve of the
winner's probability, and at the thresholds of the loaded head file (qcls/heads/thresholds.py, fitted on the
fitting split) the coverage, the precision of the answered queries and the share of the errors avoided,
beside the TF-IDF baseline (qcls/fitting/baseline.py) answering the same share of queries, its most confident
ones. Where the threshold certifies a target precision, `promise` says whether the precision on this split keeps
it (qcls/heads/bounds.py `promise`); every share carries its 95 % Wilson interval and n. Nothing here is tuned
on the scored split: the head's thresholds come from the file; the baseline's
cut-off is set to match the head's coverage on this split so the two precisions compare like for like (a
comparison, not a fit)."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from qcls.fitting import baseline
from qcls.eval.metrics import softmax
from qcls.heads import bounds
from qcls.fitting import heads as H
from qcls.heads import thresholds as T

LEVELS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)  # coverages the report's table shows the precision at
POINTS = 60  # curve points kept per prompt in result.json (for the plot)


def precision_at(c: T.Curve, coverage: float) -> float:
    """The precision of the highest threshold that answers at least `coverage` of the queries."""
    return float(c.precision[int(np.flatnonzero(c.coverage >= coverage - 1e-12)[0])])


def prompt_block(probs: np.ndarray, gold: np.ndarray, labels: list[str], threshold: T.Threshold | None,
                 base_probs: np.ndarray | None) -> dict[str, Any]:
    """One prompt over its labelled queries: `probs` [n, L] (the head's, else the raw softmax), `gold` [n]."""
    top, win = probs.max(1), probs.argmax(1)
    right = win == gold
    c = T.curve(top, right)
    keep = np.unique(np.linspace(0, len(c.thresholds) - 1, min(POINTS, len(c.thresholds))).round().astype(int))
    out: dict[str, Any] = {
        "n": int(len(gold)), "accuracy": float(right.mean()),
        "accuracy_interval": bounds.as_dict(int(right.sum()), len(gold)),
        "precision_at_coverage": {f"{lv:g}": precision_at(c, lv) for lv in LEVELS},
        "curve": {"threshold": c.thresholds[keep].round(5).tolist(), "coverage": c.coverage[keep].round(5).tolist(),
                  "precision": c.precision[keep].round(5).tolist()}}
    if base_probs is not None:
        bc = T.curve(base_probs.max(1), base_probs.argmax(1) == gold)
        out["tfidf_precision_at_coverage"] = {f"{lv:g}": precision_at(bc, lv) for lv in LEVELS}
    if threshold is not None:
        at = T.summary(T.answered(top, [labels[i] for i in win], threshold), right)
        at["threshold"] = threshold.min_prob
        if threshold.labels:
            at["label_thresholds"] = dict(threshold.labels)
        at["fitted"] = dict(threshold.fitted)
        at["intervals"] = {"coverage": bounds.as_dict(at["answered"], at["n"]),
                           "precision": bounds.as_dict(int(round((at["precision"] or 0) * at["answered"])),
                                                       at["answered"])}
        target, conf = at["fitted"].get("target_precision"), at["fitted"].get("confidence")
        if target is not None:
            k = int(round((at["precision"] or 0) * at["answered"]))
            at["promise"] = {"target_precision": target, "confidence": conf,
                             "fitted_lower_bound": at["fitted"].get("lower_bound"),
                             "verdict": bounds.promise(k, at["answered"], target, conf) if conf else
                             ("met" if at["answered"] and k / at["answered"] >= target else "not certified")}
        if base_probs is not None and at["answered"]:
            bc_at = T.fit_coverage(base_probs.max(1), base_probs.argmax(1) == gold, at["coverage"])
            at["tfidf"] = {"coverage": bc_at["coverage"], "precision": bc_at["precision"]}
        out["at_threshold"] = at
    return out


def block(per: dict, probs: dict[str, np.ndarray], head, tfidf: dict[str, np.ndarray]) -> dict[str, Any]:
    """The result's `coverage` block. `per`: PromptScores (gold), `probs`: per prompt [n, L] probabilities of
    every query (the head's or the raw softmax), `head`: the loaded Head (thresholds) or None, `tfidf`: per
    prompt the baseline's probabilities of the labelled queries."""
    out = {}
    for p, ps in per.items():
        m = ps.gold >= 0
        if not m.any():
            continue
        ph = head.prompts.get(p) if head is not None else None
        out[p] = prompt_block(probs[p][m], ps.gold[m], ps.labels, ph.threshold if ph is not None else None,
                              tfidf.get(p))
    return {"per_prompt": out, "levels": [f"{lv:g}" for lv in LEVELS]}


def tfidf_probs(prompts, scored, fit, base: dict[str, Any], folds: int) -> dict[str, np.ndarray]:
    """Per prompt the TF-IDF baseline's probabilities of the scored split's labelled queries: fitted on `fit`
    with the C the baseline chose, or (no fitting split) out of fold on the scored split, as the baseline was
    scored."""
    StratifiedKFold = H._sklearn()[0]
    out = {}
    for spec in prompts:
        b = base["per_prompt"].get(spec.name) or {}
        if "C" not in b:
            continue
        sq, sy = baseline.pairs(scored, spec)
        if not len(sy):
            continue
        p = np.zeros((len(sy), len(spec.labels)))
        splits = [(np.arange(len(sy)), None)] if fit is not None else \
            StratifiedKFold(n_splits=folds, shuffle=True, random_state=0).split(np.zeros(len(sy)), sy)
        fq, fy = baseline.pairs(fit, spec) if fit is not None else (sq, sy)
        for tr, te in splits:
            tr_q = [fq[i] for i in tr] if fit is None else fq
            tr_y = fy[tr] if fit is None else fy
            vec = baseline.vectorizer().fit(tr_q)
            f = H.fit_affine(vec.transform(tr_q), tr_y, len(spec.labels), b["C"], standardise=False)
            rows = np.arange(len(sy)) if te is None else te
            p[rows] = softmax(np.asarray(vec.transform([sq[i] for i in rows]) @ f.weights.T + f.bias))
        out[spec.name] = p
    return out


def job_block(cfg, per: dict, cal_probs: dict[str, np.ndarray] | None, head, data, fit, base: dict[str, Any],
              folds: int) -> dict[str, Any]:
    """A sweep job's `coverage` block: on the head's (or calibration's) probabilities when the job has them,
    else the raw scores' softmax; thresholds from `head` (the loaded file; None for a head fitted in the job)."""
    from qcls.eval import metrics
    probs = cal_probs if cal_probs is not None else {p: metrics.softmax(ps.scores) for p, ps in per.items()}
    try:
        tfidf = tfidf_probs(cfg.prompts, data, fit, base, folds)
    except ValueError as e:  # a split sklearn cannot fit: the curve without the baseline beside it
        tfidf = {}
        warnings.warn(f"TF-IDF baseline probabilities not computed: {e}")
    out = block(per, probs, head, tfidf)
    out["probabilities"] = "head/calibration" if cal_probs is not None else "raw scores"
    return out
