"""The tree-attention kernel equals dense masked SDPA on every token that is not padding.

On a CPU machine the kernel runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1);
on a GPU (`-m gpu`) it runs compiled, in fp16."""
from __future__ import annotations

import random

import pytest
import torch

from qcls.engine import attention as A
from qcls.engine.layout import Packer, PromptLayout, build_mask, unpack
from qcls.engine.prefix_cache import plan_prefixes
from qcls.scoring.strategies import get_strategy
from qcls.scoring.tokenization import PromptTokens
from qcls.scoring.trie import LabelTrie


def _layout(name, prefix, suffix, labels, strategy):
    pt = PromptTokens(name, tuple(f"l{i}" for i in range(len(labels))), prefix, suffix, labels, 99)
    trie = LabelTrie.build(labels, 99)
    plan = get_strategy(strategy).plan(trie)
    return PromptLayout(pt, trie, plan, trie.row_nodes(plan.read_nodes))


def _prompts(rng: random.Random, n_prompts: int, strategy: str) -> list[PromptLayout]:
    header = tuple(rng.randrange(1000) for _ in range(20))  # shared by every prefix: shared pool blocks
    out = []
    for p in range(n_prompts):
        prefix = header + tuple(rng.randrange(1000) for _ in range(rng.randrange(0, 30)))
        if p == 2:  # a template that starts with {query}: no prefix at all
            prefix = ()
        suffix = tuple(rng.randrange(1000) for _ in range(rng.randrange(1, 5)))
        labels = {tuple(rng.randrange(50, 60) for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(2, 7))}
        out.append(_layout(f"p{p}", prefix, suffix, tuple(sorted(labels)), strategy))
    return out


def _compare(device, dtype, heads, kv_heads, head_dim, n_prompts, batch, strategy, seed, tol):
    rng = random.Random(seed)
    prompts = _prompts(rng, n_prompts, strategy)
    pool = plan_prefixes([p.tokens.prefix_ids for p in prompts], 16)
    pool_len = pool.n_slots + (-pool.n_slots) % 8
    packer = Packer(prompts, pool, pool_len)
    queries = [[rng.randrange(1000) for _ in range(rng.randrange(1, 20))] for _ in range(batch)]
    n = packer.n_tokens(batch, sum(map(len, queries))) + rng.randrange(0, 40)  # and some padding
    buf = torch.zeros(packer.buffer_len(batch, n), dtype=torch.long)
    packer.pack(queries, n, buf)
    buf = buf.to(device)
    d = unpack(buf, n, packer.n_reads(batch))
    key_len = pool_len + n + (-(pool_len + n)) % 16
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, heads, head_dim, generator=g).to(device, dtype)
    k = torch.randn(kv_heads, key_len + 8, head_dim, generator=g).to(device, dtype)
    v = torch.randn(kv_heads, key_len + 8, head_dim, generator=g).to(device, dtype)
    visible = packer.visible.to(device)
    mask = torch.zeros(n, key_len, dtype=dtype, device=device).masked_fill(~build_mask(d, visible, key_len), float("-inf"))
    dense = A.DenseAttention(mask, key_len)(q, k, v)
    out = torch.full((n, heads * head_dim), float("nan"), dtype=dtype, device=device)
    tree = A.TreeAttention(d["seq"], d["anc"], d["tslot"], d["tiles"], packer.prefix_slots.to(device),
                           packer.prefix_len.to(device), pool_len,
                           packer.max_row(batch, sum(map(len, queries)), max(map(len, queries))), out)(q, k, v)
    used = int((d["prompt"] < n_prompts).sum())
    assert torch.isfinite(tree).all()  # pads too: they are never read but must not poison anything
    err = (tree[:used].float() - dense[:used].float()).abs().max().item()
    assert err <= tol, f"max |Δ| {err}"


CASES = [  # heads, kv heads, head_dim, prompts, batch, strategy
    (4, 2, 16, 2, 1, "trie"),
    (3, 1, 32, 3, 2, "exact"),  # group of 3 (padded to 4 inside the kernel)
    (2, 2, 16, 8, 4, "trie"),  # no GQA, 8 prompts, 4 queries: rows longer than one tile
    (8, 2, 16, 4, 3, "mean_logprob"),
]


@pytest.mark.skipif(A.triton is None, reason="Triton is not installed (pip install triton)")
@pytest.mark.parametrize("case", CASES)
def test_tree_attention_equals_dense_interpreted(case):
    if torch.cuda.is_available():
        pytest.skip("the GPU run is test_tree_attention_equals_dense_gpu")
    for seed in range(2):
        _compare("cpu", torch.float32, *case, seed=seed, tol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES + [(32, 8, 128, 8, 4, "trie"), (16, 4, 64, 8, 1, "exact")])
def test_tree_attention_equals_dense_gpu(case):
    if not torch.cuda.is_available() or A.triton is None:
        pytest.skip("needs a CUDA GPU with Triton")
    for seed in range(3):
        _compare("cuda", torch.float16, *case, seed=seed, tol=2e-3)


@pytest.mark.skipif(A.triton is None, reason="Triton is not installed")
def test_tree_refused_where_it_cannot_run():
    assert "power of two" in A.tree_available(torch.device("cpu"), 96)
