"""Classification metrics of one prompt (docs/design.md §9), pure functions on numpy arrays.

Inputs: `scores` [n, L] raw label scores (probabilities are their softmax over the L labels), `gold` [n]
label indices; only queries that carry a gold label for the prompt are passed in. The winner is the
argmax of the scores (the first label on a tie, as the Classifier picks it).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

ECE_BINS = 15


def log_softmax(scores: np.ndarray) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    z = s - s.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def softmax(scores: np.ndarray) -> np.ndarray:
    return np.exp(log_softmax(scores))


def accuracy(pred: np.ndarray, gold: np.ndarray) -> float:
    """Share of winners equal to gold."""
    return float(np.mean(np.asarray(pred) == np.asarray(gold)))


def confusion(pred: np.ndarray, gold: np.ndarray, n_labels: int) -> np.ndarray:
    """[n_labels, n_labels] counts: row = gold label, column = predicted label."""
    m = np.zeros((n_labels, n_labels), dtype=np.int64)
    np.add.at(m, (np.asarray(gold), np.asarray(pred)), 1)
    return m


def per_label_f1(pred: np.ndarray, gold: np.ndarray, n_labels: int) -> np.ndarray:
    """F1 of each label; NaN for a label never predicted and never gold (it has no F1)."""
    m = confusion(pred, gold, n_labels)
    tp = np.diag(m).astype(np.float64)
    fp = m.sum(axis=0) - tp
    fn = m.sum(axis=1) - tp
    denom = 2 * tp + fp + fn
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, 2 * tp / denom, np.nan)


def macro_f1(pred: np.ndarray, gold: np.ndarray, n_labels: int) -> float:
    """Mean per-label F1 over the labels that were predicted or gold at least once."""
    f1 = per_label_f1(pred, gold, n_labels)
    return float(np.nanmean(f1))


def nll(scores: np.ndarray, gold: np.ndarray) -> float:
    """Mean −log p(gold), taken through log-softmax so a tiny probability does not underflow to inf."""
    lp = log_softmax(scores)
    return float(-np.mean(lp[np.arange(len(gold)), np.asarray(gold)]))


def brier(probs: np.ndarray, gold: np.ndarray) -> float:
    """Mean over queries of Σ_labels (p(label) − [label = gold])²."""
    p = np.asarray(probs, dtype=np.float64)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(gold)), np.asarray(gold)] = 1.0
    return float(np.mean(((p - onehot) ** 2).sum(axis=1)))


def binned(conf: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> dict[str, np.ndarray]:
    """Per equal-width bin of the confidence: count, accuracy and mean confidence (NaN when empty). Bins are
    right-closed, ((k−1)/bins, k/bins], as in Guo et al. 2017."""
    conf = np.asarray(conf, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.searchsorted(edges[1:-1], conf, side="left")  # inner edges strictly below conf
    count = np.bincount(idx, minlength=bins).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.bincount(idx, weights=correct, minlength=bins) / count
        mean_conf = np.bincount(idx, weights=conf, minlength=bins) / count
    return {"edges": edges, "count": count, "accuracy": acc, "confidence": mean_conf}


def binned_ece(conf: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Σ_bins (n_bin / n) · |accuracy_bin − mean confidence_bin|."""
    r = binned(conf, correct, bins)
    used = r["count"] > 0
    w = r["count"][used] / r["count"].sum()
    return float(np.sum(w * np.abs(r["accuracy"][used] - r["confidence"][used])))


def _winner(probs: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=np.float64)
    return p.max(axis=1), (p.argmax(axis=1) == np.asarray(gold)).astype(np.float64)


def reliability(probs: np.ndarray, gold: np.ndarray, bins: int = ECE_BINS) -> dict[str, np.ndarray]:
    """`binned` over the winner's probability and whether the winner is gold."""
    return binned(*_winner(probs, gold), bins)


def ece(probs: np.ndarray, gold: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error of the winner's probability, 15 equal-width bins."""
    return binned_ece(*_winner(probs, gold), bins)


def prompt_metrics(scores: np.ndarray, gold: np.ndarray, labels: Sequence[str]) -> dict[str, Any]:
    """Every metric of one prompt, JSON-ready. `scores` [n, L] raw, `gold` [n] indices into `labels`."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(gold, dtype=np.int64)
    if s.ndim != 2 or s.shape[1] != len(labels) or y.shape != (s.shape[0],):
        raise ValueError(f"scores {s.shape} and gold {y.shape} do not fit {len(labels)} labels")
    if len(y) == 0:
        return {"n": 0}
    pred = s.argmax(axis=1)
    probs = softmax(s)
    f1 = per_label_f1(pred, y, len(labels))
    return {"n": int(len(y)), "accuracy": accuracy(pred, y), "macro_f1": float(np.nanmean(f1)),
            "majority_accuracy": majority_accuracy(y), "nll": nll(s, y), "brier": brier(probs, y), "ece": ece(probs, y),
            "f1": {lab: (None if np.isnan(v) else float(v)) for lab, v in zip(labels, f1)},
            "confusion": {"labels": list(labels), "rows": "gold", "columns": "predicted",
                          "matrix": confusion(pred, y, len(labels)).tolist()}}


def majority_accuracy(gold: np.ndarray) -> float:
    """Accuracy of always answering the most frequent gold label (the baseline a classifier must beat)."""
    y = np.asarray(gold, dtype=np.int64)
    return float(np.bincount(y).max() / len(y)) if len(y) else float("nan")


def calibration_metrics(scores: np.ndarray, gold: np.ndarray) -> dict[str, Any]:
    """The metrics that calibration or a head moves (accuracy can move too: biases change winners)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(gold, dtype=np.int64)
    if len(y) == 0:
        return {"n": 0}
    probs = softmax(s)
    pred = s.argmax(axis=1)
    return {"n": int(len(y)), "accuracy": accuracy(pred, y), "macro_f1": macro_f1(pred, y, s.shape[1]),
            "nll": nll(s, y), "brier": brier(probs, y), "ece": ece(probs, y)}


def mean_over_prompts(per_prompt: dict[str, dict[str, Any]], keys: Sequence[str]) -> dict[str, float | None]:
    """Unweighted mean of each metric over the prompts that have it (each prompt counts once)."""
    out: dict[str, float | None] = {}
    for k in keys:
        vals = [m[k] for m in per_prompt.values() if m.get("n") and m.get(k) is not None]
        out[k] = float(np.mean(vals)) if vals else None
    return out
