"""The "with calibration" columns of a sweep job: accuracy / NLL / ECE / Brier on the eval split before and
after a per-prompt calibration, computed in Python from the raw scores with `Head.apply`.

The calibration is either fitted inside the job on `eval.fit_on` (the dev split when the job scores the
test split), or, without `fit_on`, the file the config loads (`calibration=FILE`; its calibrated scores
come from the engine's tail)."""
from __future__ import annotations

from typing import Any

import numpy as np

from qcls.eval import metrics
from qcls.fitting.calibration import fit
from qcls.heads.head import Head
from qcls.eval.scores import PromptScores

KEYS = ("accuracy", "macro_f1", "nll", "ece", "brier")


def fit_on_split(fit_per: dict[str, PromptScores], method: str, meta: dict[str, Any]) -> Head:
    scores, gold, labels = {}, {}, {}
    for p, ps in fit_per.items():
        scores[p], gold[p] = ps.labelled()
        labels[p] = ps.labels
    return fit(scores, gold, labels, method, meta=meta)


def apply(cal: Head, prompt: str, scores: np.ndarray) -> np.ndarray:
    return np.array([cal.apply(prompt, row) for row in scores], dtype=np.float64).reshape(scores.shape)


def columns(per: dict[str, PromptScores], calibrated: dict[str, np.ndarray], source: str, method: str,
            n_fit: dict[str, int] | None = None) -> dict[str, Any]:
    """Per prompt raw → calibrated metrics over the queries with a gold label, and their means."""
    out: dict[str, Any] = {"source": source, "method": method, "n_fit": n_fit, "per_prompt": {}}
    for p, ps in per.items():
        m = ps.has_gold
        out["per_prompt"][p] = {"raw": metrics.calibration_metrics(ps.scores[m], ps.gold[m]),
                                "calibrated": metrics.calibration_metrics(calibrated[p][m], ps.gold[m])}
    out["mean"] = {side: metrics.mean_over_prompts({p: v[side] for p, v in out["per_prompt"].items()}, KEYS)
                   for side in ("raw", "calibrated")}
    return out


def fitted_columns(per: dict[str, PromptScores], cal: Head, source: str) -> dict[str, Any]:
    n = cal.meta.get("n")  # per prompt for a fitted calibration, the number of content-free inputs otherwise
    n_fit = {p: int(v) for p, v in n.items()} if isinstance(n, dict) else None
    return columns(per, {p: apply(cal, p, ps.scores) for p, ps in per.items()}, source, cal.method, n_fit)


def file_columns(per: dict[str, PromptScores], path: str, method: str) -> dict[str, Any]:
    """From the engine's head logits (LabelScore.head_score) under `calibration=FILE`; a prompt without a head
    in the file (the model's default head covers only the prompts it was fitted for) keeps its raw scores."""
    return columns(per, file_logits(per), f"file {path}", method)


def file_logits(per: dict[str, PromptScores]) -> dict[str, np.ndarray]:
    return {p: ps.scores if ps.calibrated is None else ps.calibrated for p, ps in per.items()}
