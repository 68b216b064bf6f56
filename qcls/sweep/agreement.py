"""Winner agreement with the `exact` strategy (Σ full-vocabulary log-probs of the label's tokens).

How it can be had depends on the job's strategy:
- exact: the job's own scores (agreement 1 by definition);
- mean_logprob: the same forward, since exact = mean_logprob × the label's token count;
- trie / first_token: their packed rows hold only the root and branching-node tokens, not every label
  token, so the same forward cannot give exact scores: a separate exact-strategy pass over the same
  loaded weights, run after the latency and memory measurements, when `eval.agreement_with_exact` and the
  backend keeps the full LM head on the device. Otherwise null, with the reason.
Winners are compared by raw score (a configured calibration does not enter), over every query of the set.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from qcls.eval.scores import PromptScores

SAME_FORWARD = ("exact", "mean_logprob")


def exact_winners_same_forward(strategy: str, per: dict[str, PromptScores]) -> dict[str, np.ndarray]:
    if strategy == "exact":
        return {p: ps.winners for p, ps in per.items()}
    if strategy == "mean_logprob":
        return {p: (ps.scores * ps.tokens[None, :]).argmax(axis=1) for p, ps in per.items()}
    raise ValueError(f"scoring={strategy} does not hold exact scores in its forward")


def method_for(strategy: str) -> str:
    return {"exact": "the job's own scores (scoring=exact)",
            "mean_logprob": "same forward: exact = mean_logprob × label token count (LabelScore.tokens)"
            }.get(strategy, "separate scoring=exact pass over the same loaded weights, after the latency and "
                            "memory measurements")


def skip_reason(strategy: str, enabled: bool, full_head_on_device: bool) -> str | None:
    """Why a trie / first_token job gets no agreement (None: run the separate pass)."""
    if strategy in SAME_FORWARD:
        return None
    if not enabled:
        return "eval.agreement_with_exact=false: the separate exact pass was not run"
    if not full_head_on_device:
        return ("the backend does not keep the full LM head on the device, which exact scores need "
                "(for fp16-offload: backend.options.full_head=true)")
    return None


def agreement(per: dict[str, PromptScores], exact: dict[str, np.ndarray]) -> dict[str, Any]:
    """Share of queries whose winner equals the exact strategy's, per prompt and the mean over prompts."""
    by = {p: float(np.mean(ps.winners == exact[p])) for p, ps in per.items()}
    return {"per_prompt": by, "mean": float(np.mean(list(by.values())))}


def compute(strategy: str, per: dict[str, PromptScores], enabled: bool, full_head_on_device: bool,
            exact_pass: Callable[[], dict[str, np.ndarray]]) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
    """(the result's `agreement_with_exact` block, exact winners per prompt or None)."""
    block: dict[str, Any] = {"method": method_for(strategy), "per_prompt": None, "mean": None, "reason": None}
    if strategy in SAME_FORWARD:
        winners = exact_winners_same_forward(strategy, per)
    else:
        why = skip_reason(strategy, enabled, full_head_on_device)
        if why is not None:
            block.update(method=None, reason=why)
            return block, None
        try:
            winners = exact_pass()
        except Exception as e:  # the job's own measurements stand; say why this one is missing
            block.update(reason=f"the exact pass failed: {type(e).__name__}: {e}")
            return block, None
    block.update(agreement(per, winners))
    return block, winners
