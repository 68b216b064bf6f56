"""Fitting per-prompt temperature/bias calibrations (docs/design.md §9): affine heads on the raw scores alone
(qcls/heads/head.py; learned heads on hidden states are fitted in qcls/fitting/heads.py).

`fit` minimises the NLL of the gold labels on dev scores; `contextual` measures the bias on content-free
queries (Zhao et al., 2021). Both give a `Head` whose YAML file the `calibration` config option loads.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from qcls.heads.files import FIT_METHODS, now
from qcls.heads.head import Head, PromptHead

# ---- fitting on dev scores ---------------------------------------------------------------------------
def _nll(s: torch.Tensor, y: torch.Tensor, log_t: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy((s + b) / torch.exp(log_t), y)


def _fit_prompt(s: np.ndarray, y: np.ndarray, method: str, l2: float) -> tuple[float, list[float], dict]:
    """Minimise mean NLL + l2/2·|b/T|² over log T and/or b (float64 LBFGS, deterministic). The NLL does not
    see a constant added to every bias; the L2 term pins the optimum to Σb = 0 and keeps a label with few dev
    examples from running to ±∞. It is taken on b/T, the bias in calibrated units, so that it does not
    depend on the scale of the raw scores."""
    st, yt = torch.tensor(s, dtype=torch.float64), torch.tensor(y, dtype=torch.long)
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=method != "bias")
    b = torch.zeros(st.shape[1], dtype=torch.float64, requires_grad=method != "temperature")
    params = [p for p in (log_t, b) if p.requires_grad]

    def objective() -> torch.Tensor:
        return _nll(st, yt, log_t, b) + 0.5 * l2 * (b * b).sum() / torch.exp(2 * log_t)
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=500, history_size=20, tolerance_grad=1e-10,
                            tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss
    with torch.no_grad():
        before = _nll(st, yt, log_t, b).item()
        start = objective().item()
    opt.step(closure)
    with torch.no_grad():
        if not objective().item() <= start:  # LBFGS diverged (or NaN): keep the identity
            log_t.zero_(), b.zero_()
        b -= b.mean()  # the exact gauge; the NLL is unchanged
        after = _nll(st, yt, log_t, b).item()
    return math.exp(log_t.item()), b.tolist(), {"nll_before": round(before, 6), "nll_after": round(after, 6)}


def fit(scores: dict[str, np.ndarray], gold: dict[str, np.ndarray], labels: dict[str, list[str]],
        method: str = "temperature_bias", *, l2: float = 1e-2, meta: dict | None = None) -> Head:
    """Per prompt: scores[p] [n, L] raw scores, gold[p] [n] label indices, labels[p] the L labels. A prompt
    with no examples is left out (the identity). `meta` (strategy, model, fitted_on …) goes into the file."""
    if method not in FIT_METHODS:
        raise ValueError(f"calibration method {method!r} cannot be fitted; use one of {list(FIT_METHODS)} "
                         "(contextual calibration comes from `contextual`)")
    prompts, stats, skipped = {}, {}, []
    for name, labs in labels.items():
        s = np.asarray(scores.get(name, np.zeros((0, len(labs)))), dtype=np.float64)
        y = np.asarray(gold.get(name, np.zeros(0)), dtype=np.int64)
        if s.ndim != 2 or s.shape[1] != len(labs) or y.shape != (s.shape[0],):
            raise ValueError(f"prompt {name!r}: scores of shape {s.shape} and gold of shape {y.shape} do not "
                             f"match its {len(labs)} labels (want [n, {len(labs)}] and [n])")
        if len(y) == 0:
            skipped.append(name)
            continue
        if not np.isfinite(s).all() or y.min() < 0 or y.max() >= len(labs):
            raise ValueError(f"prompt {name!r}: scores must be finite and gold indices in [0, {len(labs)})")
        with torch.inference_mode(False), torch.enable_grad():  # callable from inside a no-grad request path
            t, b, st = _fit_prompt(s, y, method, l2)
        prompts[name] = PromptHead.temperature_bias(list(labs), t, b)
        stats[name] = {"n": int(len(y)), **st}
    info = {"strategy": None, "model": None, "prompts": list(prompts), "fitted_on": None,
            "n": {k: v["n"] for k, v in stats.items()}, "date": now(), "l2": l2,
            "fit": {k: {x: v[x] for x in ("nll_before", "nll_after")} for k, v in stats.items()}}
    if skipped:
        info["skipped (no examples)"] = skipped
    return Head(prompts, method, {**info, **(meta or {})})


# ---- contextual calibration --------------------------------------------------------------------------
def contextual(clf, inputs: Sequence[str] = ("N/A", "[MASK]")) -> Head:
    """Zhao et al. 2021: p_cf = the Classifier's raw label probabilities averaged over content-free inputs;
    b = −log p_cf, T = 1, so calibrated probabilities ∝ p / p_cf."""
    results = clf.classify(list(inputs))
    bad = [f"{r.query!r}: {r.error}" for r in results if not r.ok]
    if bad:
        raise ValueError(f"content-free inputs refused by the classifier: {'; '.join(bad)}")
    prompts = {}
    for i, name in enumerate(clf.prompt_names):
        per = [r.prompts[i] for r in results]
        labs = [ls.label for ls in per[0].labels]
        p_cf = [math.fsum(_raw_prob(pr.labels[j]) for pr in per) / len(per) for j in range(len(labs))]
        prompts[name] = PromptHead.temperature_bias(labs, 1.0, [-math.log(max(p, 1e-300)) for p in p_cf])
    meta = {"strategy": clf.cfg.strategy, "model": clf.cfg.model.name, "prompts": list(prompts),
            "fitted_on": f"content-free inputs {list(inputs)}", "n": len(inputs), "date": now()}
    return Head(prompts, "contextual", meta)


def _raw_prob(ls) -> float:
    """The raw scores' probability of a label, whether or not the classifier loads a head."""
    return ls.prob if ls.raw_prob is None else ls.raw_prob


