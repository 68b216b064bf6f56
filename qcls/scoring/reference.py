"""The reference scorer: slow and obviously right; the ground truth the fast engine is held to.

One plain forward of the unmodified transformers model per (prompt, label) over the canonical ids
(prefix + query + suffix + label tokens [+ end token]), a full-vocabulary log-softmax, and every
strategy's score read off it directly, without the engine's plans or packing. A head that reads hidden
states gets them from one more plain forward of prefix + query + suffix, caught by hooks on the decoder's
layers and final norm, and is applied in float64.
"""
from __future__ import annotations

import time

import torch

from qcls.config.schema import STRATEGIES
from qcls.scoring.tokenization import PromptTokens
from qcls.scoring.trie import LabelTrie

ROWS_KEPT = 8  # the fewest positions given to the LM head (label_logits)


@torch.inference_mode()
def label_logits(model, ids: list[int], first: int = 0) -> torch.Tensor:
    """Full-vocabulary logits [len(ids) - first, vocab] in float32 of positions `first`… from one plain forward
    of all of `ids` (transformers' `logits_to_keep`: the LM head is applied only where a score reads it, which on
    a 262k vocabulary is most of a forward)."""
    dev = next(model.parameters()).device
    want = len(ids) - first
    # at least ROWS_KEPT rows: a CPU GEMM of 1 to 3 rows takes another kernel than a taller one (from 4 rows on,
    # every row gets the same bits), and a position's logits would then change in their last bits with the number
    # of positions a label reads
    keep = min(len(ids), max(want, ROWS_KEPT))
    return model(input_ids=torch.tensor([ids], device=dev), logits_to_keep=keep).logits[0, -want:].float().cpu()


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
    return reference_label_scores(model, pt, trie, query_ids)[strategy]


def reference_label_scores(model, pt: PromptTokens, trie: LabelTrie, query_ids: list[int]) -> dict[str, list[float]]:
    """Every strategy's scores of every label of one prompt for one query, read off the same forwards (one per
    label): {strategy: [score per label]}."""
    base = list(pt.prefix_ids) + list(query_ids) + list(pt.suffix_ids)
    scores: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    for li, label in enumerate(pt.label_ids):
        extra = [trie.end_id] if trie.nodes[trie.label_paths[li][-1]].children else []
        logits = label_logits(model, base + list(label) + extra, first=len(base) - 1)
        for s in STRATEGIES:  # row 0: the last base position
            scores[s].append(score_label(s, logits, 1, label, trie, li))
    return scores


@torch.inference_mode()
def reference_states(model, pt: PromptTokens, query_ids: list[int], taps) -> torch.Tensor:
    """[len(taps), H] float32: each tap (qcls.heads.head.Tap) of one prompt and query from a plain forward of
    prefix + query + suffix: the residual stream entering decoder layer `layer` (= after `layer` layers) or
    the final norm's output, at the last token (the read position) or averaged over the query's tokens."""
    base = list(pt.prefix_ids) + list(query_ids) + list(pt.suffix_ids)
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    seen: dict = {}
    hooks = [inner.norm.register_forward_hook(lambda m, a, out: seen.__setitem__("final", out[0]))]
    for layer in sorted({t.layer for t in taps if t.layer != "final"}):
        def grab(m, args, kwargs, layer=layer):
            seen[layer] = (args[0] if args else kwargs["hidden_states"])[0]
        hooks.append(inner.layers[layer].register_forward_pre_hook(grab, with_kwargs=True))
    try:
        dev = next(model.parameters()).device
        model(input_ids=torch.tensor([base], device=dev), logits_to_keep=1)  # the states, not the logits, are read
    finally:
        for h in hooks:
            h.remove()
    q0, q1 = len(pt.prefix_ids), len(pt.prefix_ids) + len(query_ids)
    out = [seen[t.layer][len(base) - 1] if t.kind == "position" else seen[t.layer][q0:q1].float().mean(0)
           for t in taps]
    return torch.stack([x.float().cpu() for x in out])


class ReferenceEngine:
    """The reference scorer behind the engine interface (engine.kind=reference): for checking only.
    `heads` (per prompt a qcls.heads.head.PromptHead or None) are applied in float64 to the raw scores and,
    where a head reads them, to hidden states from a plain forward (reference_states)."""
    graphs = False

    def __init__(self, model, layouts, strategy: str, heads=None):
        self.model, self.layouts, self.strategy = model, layouts, strategy
        self.heads = list(heads) if heads is not None else [None] * len(layouts)

    def _head(self, h, lay, ids: list[int], scores: list[float]) -> list[float]:
        if h is None:
            return list(scores)
        feats = reference_states(self.model, lay.tokens, ids, h.read.taps).numpy() if h.read else None
        return h.apply(scores, feats)

    def run(self, batch: list[list[int]]):
        t0 = time.perf_counter()
        scores = [[reference_scores(self.model, lay.tokens, lay.trie, ids, self.strategy) for lay in self.layouts]
                  for ids in batch]
        calibrated = [[self._head(h, lay, ids, s) for h, lay, s in zip(self.heads, self.layouts, per)]
                      for ids, per in zip(batch, scores)]
        forward_ms = (time.perf_counter() - t0) * 1e3
        tokens = sum(len(lay.tokens.prefix_ids) + len(ids) + len(lay.tokens.suffix_ids) + len(lab)
                     for ids in batch for lay in self.layouts for lab in lay.tokens.label_ids)
        return scores, calibrated, {"prepare": 0.0, "forward": forward_ms, "score": 0.0, "device_wait": 0.0}, tokens

    # the engine interface a server pipelines through: the plain forwards run at launch, collect hands them over
    def launch(self, batch: list[list[int]]):
        return self.run(batch)

    def collect(self, launched):
        return launched

    @staticmethod
    def done(launched) -> bool:
        return True  # launch computed it
