"""Results from a batch's scores (Classifier.finish): per prompt every label's score and probability, the winner,
a head's beside the LLM's own, and abstention where a head file gives a threshold (docs/design.md §7, §9-11); then
each query's timings and meta (`fill_batch`)."""
from __future__ import annotations

import math

import torch

from qcls.errors import ConfigError
from qcls.heads import thresholds
from qcls.heads.head import Head
from qcls.results import STAGES, LabelScore, PromptResult, QueryResult


class ResultBuilder:
    """Built once per Classifier: `plan` per prompt (name, labels, label token counts, whether a head answers it);
    `scored`: the forward computes label scores (False: it stops at the heads' layer); `head`: the served file."""

    def __init__(self, plan: list[tuple[str, list[str], list[int], bool]], scored: bool, head: Head | None):
        self.plan, self.scored = plan, scored
        self.limits = thresholds.limits_of(head, [name for name, *_ in plan])
        self.abstains = any(t is not None for t in self.limits)

    def build(self, scores: list[list[float]], heads_: list[list[float]], probs_: list[list[float]] | None = None,
              hprobs_: list[list[float]] | None = None) -> list[PromptResult]:
        """Per prompt: probabilities (softmax in float64: the fast engine's from the device, engine/probs.py, else
        computed here) and winner; with a head (or calibration) the probabilities and the winner are the head's,
        and the raw winner and raw probabilities are kept beside them."""
        out = []
        append = out.append
        if probs_ is None:
            probs_, hprobs_ = [softmax(v) for v in scores], [softmax(v) for v in heads_]
        for (name, names, counts, headed), vals, hvals, probs, hprobs in zip(self.plan, scores, heads_, probs_,
                                                                             hprobs_):
            if not self.scored:  # the forward stopped at the heads' layer: no label scores, no raw winner
                hbest = argmax(hvals, max(hvals))
                append(PromptResult(name, names[hbest], hprobs[hbest],
                                    [LabelScore(n, None, p, c, None, h) for n, p, c, h in zip(names, hprobs, counts,
                                                                                              hvals)]))
                continue
            best = argmax(vals, max(vals))
            if not headed:  # no head, or none for this prompt: the LLM's own label scores
                append(PromptResult(name, names[best], probs[best], list(map(LabelScore, names, vals, probs, counts))))
                continue
            hbest = argmax(hvals, max(hvals))
            append(PromptResult(name, names[hbest], hprobs[hbest],
                                list(map(LabelScore, names, vals, hprobs, counts, probs, hvals)), names[best],
                                probs[best]))
        if self.abstains:
            thresholds.apply(out, self.limits)
        return out


def fill_batch(results: list[QueryResult], good: list[tuple[int, list[int], float]], built: list[list[PromptResult]],
               stages: dict[str, float], post_ms: float, meta: dict,
               device_wait: float | None = None) -> list[QueryResult]:
    """Each good query's result once its batch's forward is read (`good`: index into `results`, ids, tokenize ms;
    `built`: its prompts): the batch size, `timings_ms` (its own tokenize, the stages the batch shares, the total;
    `device_wait` where a server counts it as queue wait) and its own copy of `meta`."""
    # what every query of the batch shares, rounded once; each result gets its own dicts
    shared = {k: round(stages[k], 4) for k in STAGES[1:-1]}
    shared["postprocess"] = round(post_ms, 4)
    n_good = len(good)
    for (i, _, tok_ms), prompts in zip(good, built):
        r = results[i]
        r.prompts, r.batch_size = prompts, n_good
        t = {"tokenize": round(tok_ms, 4), **shared}
        t["total"] = round(sum(t.values()), 4)
        if device_wait is not None:
            t["device_wait"] = round(device_wait, 4)
        r.timings_ms = t
        r.meta = dict(meta)
    return results


def check_finite(result: QueryResult, dtype: torch.dtype) -> None:
    """Scores that are not finite at warm-up come from the weights and dtype, not the query: refuse to start
    rather than serve NaN. (fp16 overflows where a model's residual stream exceeds 65504, as gemma-3-270m's
    does at ~1e5.)"""
    bad = [p.prompt for p in result.prompts
           if not all(math.isfinite(x.score if x.score is not None else x.head_score) for x in p.labels)]
    if bad:
        raise ConfigError(f"the warm-up query's scores are not finite under prompts {bad} in {dtype}: the "
                          "model's activations overflow that dtype", "backend.dtype=float32")


def argmax(vals: list[float], top: float) -> int:
    """The first index of the largest value (max over indices by value, as before: a NaN compares as it did)."""
    return vals.index(top) if top == top else max(range(len(vals)), key=vals.__getitem__)


def softmax(vals: list[float]) -> list[float]:
    top = max(vals)
    exps = [math.exp(v - top) for v in vals]
    z = sum(exps)  # each term ≤ 1 and one is exactly 1: plain float64 summation loses nothing that shows
    return [e / z for e in exps]
