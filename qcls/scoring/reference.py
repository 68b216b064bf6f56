"""The reference scorer: slow and obviously right; the ground truth the fast engine is held to.

One plain forward of the unmodified transformers model per (prompt, label) over the canonical ids
(prefix + query + suffix + label tokens [+ end token]), a full-vocabulary log-softmax, and every
strategy's score read off it directly, without the engine's plans or packing.
"""
from __future__ import annotations

import time

import torch

from qcls.scoring.tokenization import PromptTokens
from qcls.scoring.trie import LabelTrie


@torch.inference_mode()
def label_logits(model, ids: list[int]) -> torch.Tensor:
    """Full-vocabulary logits [len(ids), vocab] in float32 from one plain forward."""
    dev = next(model.parameters()).device
    return model(input_ids=torch.tensor([ids], device=dev)).logits[0].float().cpu()


def score_label(strategy: str, logits: torch.Tensor, base_len: int, label: tuple[int, ...],
                trie: LabelTrie, label_index: int) -> float:
    """Score one label from the logits of base + label (+ end). Position base_len - 1 + i predicts
    the i-th label token."""
    logp = torch.log_softmax(logits, -1)
    at = [base_len - 1 + i for i in range(len(label))]
    if strategy == "first_token":
        return logits[at[0], label[0]].item()
    if strategy in ("exact", "mean_logprob"):
        total = sum(logp[p, t].item() for p, t in zip(at, label))
        return total / len(label) if strategy == "mean_logprob" else total
    if strategy == "trie":
        total = 0.0
        for i, (node, tok) in enumerate(trie.label_steps(label_index, with_end=True)):
            choices = trie.child_tokens(node)
            if len(choices) >= 2:  # a node with one way forward carries no choice
                row = logits[base_len - 1 + i, choices]
                total += torch.log_softmax(row, -1)[choices.index(tok)].item()
        return total
    raise ValueError(f"unknown strategy {strategy!r}")


def reference_scores(model, pt: PromptTokens, trie: LabelTrie, query_ids: list[int], strategy: str) -> list[float]:
    """Scores of every label of one prompt for one query: one forward per label."""
    base = list(pt.prefix_ids) + list(query_ids) + list(pt.suffix_ids)
    scores = []
    for li, label in enumerate(pt.label_ids):
        extra = [trie.end_id] if trie.nodes[trie.label_paths[li][-1]].children else []
        logits = label_logits(model, base + list(label) + extra)
        scores.append(score_label(strategy, logits, len(base), label, trie, li))
    return scores


class ReferenceEngine:
    """The reference scorer behind the engine interface (engine.kind=reference): for checking only.
    `calibration` (qcls.scoring.calibration.Calibration) is applied to the raw scores in plain Python."""
    graphs = False

    def __init__(self, model, layouts, strategy: str, calibration=None):
        self.model, self.layouts, self.strategy, self.calibration = model, layouts, strategy, calibration

    def run(self, batch: list[list[int]]):
        t0 = time.perf_counter()
        scores = [[reference_scores(self.model, lay.tokens, lay.trie, ids, self.strategy) for lay in self.layouts]
                  for ids in batch]
        calibrated = [[self.calibration.apply(lay.tokens.name, s) if self.calibration else list(s)
                       for lay, s in zip(self.layouts, per)] for per in scores]
        forward_ms = (time.perf_counter() - t0) * 1e3
        tokens = sum(len(lay.tokens.prefix_ids) + len(ids) + len(lay.tokens.suffix_ids) + len(lab)
                     for ids in batch for lay in self.layouts for lab in lay.tokens.label_ids)
        return scores, calibrated, {"prepare": 0.0, "forward": forward_ms, "score": 0.0, "device_wait": 0.0}, tokens

    # the engine interface a server pipelines through: the plain forwards run at launch, collect hands them over
    def launch(self, batch: list[list[int]]):
        return self.run(batch)

    def collect(self, launched):
        return launched
