"""Tree-attention kernel vs dense masked SDPA, and the kernel's block/warp choices (GPU; not a test).

    PYTHONPATH=. python bench/attention.py

One decoder layer's attention for Qwen3-4B/8B head shapes (32 query heads, 8 KV heads, d=128) over the
real packed layout of the 8 e-commerce prompts (Qwen tokenizer, `trie`), batch 1 and 4; timed as 36
back-to-back calls in one CUDA graph (one forward's worth). Appends to bench/RESULTS.md.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common as C  # noqa: E402
from qcls.compose import compose  # noqa: E402
from qcls.engine import attention as A  # noqa: E402
from qcls.engine.layout import Packer, PromptLayout, build_mask, unpack  # noqa: E402
from qcls.engine.prefix_cache import plan_prefixes  # noqa: E402
from qcls.qwen_tokenizer import build_qwen_tokenizer  # noqa: E402
from qcls.scoring.strategies import get_strategy  # noqa: E402
from qcls.scoring.tokenization import encode_prompt, encode_query  # noqa: E402
from qcls.scoring.trie import LabelTrie  # noqa: E402

QUERIES = ["women's summer floral midi dress", "mens slim fit jeans", "夏季女士碎花连衣裙", "boys hoodie size 140"]
LAYERS, HEADS, KV, D = 36, 32, 8, 128


def layouts(tok) -> list[PromptLayout]:
    out = []
    for spec in compose(["prompts=ecommerce8"]).prompts:
        pt = encode_prompt(tok, spec)
        trie = LabelTrie.build(pt.label_ids, pt.end_id)
        plan = get_strategy("trie").plan(trie)
        out.append(PromptLayout(pt, trie, plan, trie.row_nodes(plan.read_nodes)))
    return out


def main() -> None:
    tok = build_qwen_tokenizer()
    prompts = layouts(tok)
    pool = plan_prefixes([p.tokens.prefix_ids for p in prompts], 16)
    pool_len = pool.n_slots + (-pool.n_slots) % 8
    packer = Packer(prompts, pool, pool_len)
    rows = []
    for b in (1, 4):
        batch = [encode_query(tok, q, 64) for q in QUERIES[:b]]
        n = packer.n_tokens(b, sum(map(len, batch)))
        buf = torch.zeros(packer.buffer_len(b, n), dtype=torch.long)
        packer.pack(batch, n, buf)
        d = unpack(buf.cuda(), n, packer.n_reads(b))
        key_len = pool_len + n + (-(pool_len + n)) % 16
        q = torch.randn(n, HEADS, D, device="cuda", dtype=torch.float16)
        k = torch.randn(KV, key_len, D, device="cuda", dtype=torch.float16)
        v = torch.randn(KV, key_len, D, device="cuda", dtype=torch.float16)
        mask = torch.zeros(n, key_len, device="cuda", dtype=torch.float16).masked_fill(
            ~build_mask(d, packer.visible.cuda(), key_len), float("-inf"))
        dense = A.DenseAttention(mask, key_len)
        ref = dense(q, k, v)
        used = int((d["prompt"] < len(prompts)).sum())
        max_row = packer.max_row(b, sum(map(len, batch)), 64)
        rows.append((b, n, "dense SDPA (mem-efficient)", C.graph_ms(lambda: [dense(q, k, v) for _ in range(LAYERS)]), 0.0))
        for bn in (32, 64):
            for warps in (2, 4, 8):
                out = torch.empty(n, HEADS * D, device="cuda", dtype=torch.float16)
                tree = A.TreeAttention(d["seq"], d["anc"], d["tslot"], d["tiles"], packer.prefix_slots.cuda(),
                                       packer.prefix_len.cuda(), pool_len, max_row, out, bn, warps)
                err = (tree(q, k, v)[:used].float() - ref[:used].float()).abs().max().item()
                rows.append((b, n, f"tree BN={bn} warps={warps}", C.graph_ms(lambda: [tree(q, k, v) for _ in range(LAYERS)]),
                             err))
    text = C.header("attention: tree kernel vs dense SDPA, 8 e-commerce prompts, Qwen3-4B/8B heads",
                    f"bench/attention.py; {LAYERS} calls captured in one CUDA graph (one forward's layers); H={HEADS}, KV={KV}, d={D}")
    text += "| batch | tokens | kernel | ms / 36 layers | max abs Δ vs dense |\n|---|---|---|---|---|\n"
    text += "".join(f"| {b} | {n} | {name} | {ms:.3f} | {err:.4f} |\n" for b, n, name, ms, err in rows)
    C.append(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
