"""What `qcls check` knows about the prompt set a running Classifier serves: each label's tokens and trie cost,
the prefix tokens shared with other prompts, the forward's token count and its projected T4 time. Read from the
Classifier's own layouts (no tokenization again); the playground page shows it beside the scores (GET /v1/check).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from qcls.backends.memory import param_counts
from qcls.check.report import PromptCheck, forward_tokens, label_costs
from qcls.engine.prefix_cache import plan_prefixes
from qcls.scoring.tokenization import token_text

if TYPE_CHECKING:
    from qcls.classifier import Classifier

# The T4 projection of docs/design.md §8 (the benchmarks' too): the layers' weights read at 75 % of 320 GB/s plus
# their GEMM FLOPs at 50 % of 65 TFLOP/s. A model, not a measurement.
T4_BW, T4_BW_EFF, T4_FLOPS, T4_FLOP_EFF = 320e9, 0.75, 65e12, 0.5
FP16_BYTES = 2


def t4_projection(layer_bytes: int, layer_params: int, tokens: int) -> float:
    """Projected ms of one forward of `tokens` tokens through decoder layers of `layer_params` parameters held in
    `layer_bytes` bytes."""
    return (layer_bytes / (T4_BW * T4_BW_EFF) + 2 * layer_params * tokens / (T4_FLOPS * T4_FLOP_EFF)) * 1e3


def t4_ms(layer_params: int, tokens: int) -> float:
    """The same for fp16 layers."""
    return t4_projection(layer_params * FP16_BYTES, layer_params, tokens)


def served_check(clf: "Classifier", query_tokens: int = 8) -> dict[str, Any]:
    """The check facts of `clf`'s prompts, as JSON: per prompt its template, label prefix, labels and their
    costs; the forward's tokens at batch 1 and engine.max_batch_size for queries of `query_tokens` tokens, each
    with its T4 projection over the layers the forward runs."""
    cfg, tok = clf.cfg, clf.tokenizer
    pool = plan_prefixes([lay.tokens.prefix_ids for lay in clf.layouts], cfg.engine.prefix_block_size)
    prompts = []
    for p, (spec, lay) in enumerate(zip(cfg.prompts, clf.layouts)):
        end = token_text(tok, lay.trie.end_id) if lay.trie.needs_end() else None
        check = PromptCheck(spec.name, len(lay.tokens.prefix_ids), pool.shared_tokens(p), len(lay.tokens.suffix_ids),
                            len(lay.row_nodes), end, label_costs(lay))
        entry = {**asdict(check), "template": spec.template, "label_prefix": spec.label_prefix,
                 "label_end": spec.label_end}
        firsts = [ids[0] for ids in lay.tokens.label_ids]
        for li, lab in enumerate(entry["labels"]):  # labels whose first token is this one's: a deeper trie read
            lab["shares_first_token"] = [o for o, f in zip(lay.tokens.labels, firsts) if f == firsts[li] and o != lab["label"]]
        prompts.append(entry)
    pool_tokens, forwards = forward_tokens(cfg, clf.layouts, min(query_tokens, cfg.max_query_tokens))
    pc = param_counts(clf.loaded.source_config)
    layers = clf.depth.layers or pc.layers
    layer_params = layers * (pc.layer_linear + pc.layer_other)
    return {"model": cfg.model.name, "strategy": cfg.strategy, "fingerprint": clf.fingerprint,
            "prompts": prompts, "prefix_pool_tokens": pool_tokens, "depth": clf.depth.as_dict(),
            "limits": {"max_queries_per_request": cfg.max_queries_per_request, "max_query_tokens": cfg.max_query_tokens},
            "forward": [{**asdict(f), "t4_ms": round(t4_ms(layer_params, f.tokens), 2)} for f in forwards],
            "t4_model": "layer weights (fp16) at 75 % of 320 GB/s + GEMM FLOPs at 50 % of 65 TFLOP/s "
                        "(docs/design.md §8; a projection, not a measurement)"}
