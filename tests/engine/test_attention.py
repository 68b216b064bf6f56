"""The tree-attention kernels equal dense masked SDPA on every token that is not padding: prefixes walked
inline and split into chunks (partial softmax states merged per tile), with and without a sliding window.

On a CPU machine the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1);
on a GPU (`-m gpu`) they run compiled, in fp16."""
from __future__ import annotations

import random

import pytest
import torch

from qcls.engine import attention as A
from qcls.engine.layout import Packer, PromptLayout, build_mask, unpack
from qcls.engine.prefix_cache import plan_prefixes
from qcls.engine.tree_plan import Tuning, plan_tree, tuning_for
from qcls.scoring.strategies import get_strategy
from qcls.scoring.tokenization import PromptTokens
from qcls.scoring.trie import LabelTrie

needs_triton = pytest.mark.skipif(A.triton is None, reason="Triton is not installed (pip install triton)")
INLINE = Tuning(inline_reads=1 << 30, row_bn=16)


def split(chunk: int, qb: int = 1, row_bt: int = 16, unmasked: bool = False) -> Tuning:
    """Every prefix split into chunks of `chunk` keys (tiny, so the CPU interpreter sees many of them); with
    `unmasked`, whole 16-key steps load without masks and only a chunk's last partial step is masked."""
    return Tuning(inline_reads=0, min_chunk=chunk, max_chunk=chunk, partial_limit=1e9, bq=16, qb=qb, bn=16,
                  row_bt=row_bt, row_bn=16, unmasked=unmasked)


def _layout(name, prefix, suffix, labels, strategy):
    pt = PromptTokens(name, tuple(f"l{i}" for i in range(len(labels))), prefix, suffix, labels, 99)
    trie = LabelTrie.build(labels, 99)
    plan = get_strategy(strategy).plan(trie)
    return PromptLayout(pt, trie, plan, trie.row_nodes(plan.read_nodes))


def _random_prompts(rng: random.Random, n_prompts: int, strategy: str) -> list[PromptLayout]:
    header = tuple(rng.randrange(1000) for _ in range(20))  # shared by every prefix: shared pool blocks
    out = []
    for p in range(n_prompts):
        prefix = header + tuple(rng.randrange(1000) for _ in range(rng.randrange(0, 30)))
        if p == 2:  # a template that starts with {query}: no prefix at all
            prefix = ()
        out.append(_with_labels(rng, f"p{p}", prefix, strategy))
    return out


def _with_labels(rng, name, prefix, strategy="trie"):
    suffix = tuple(rng.randrange(1000) for _ in range(rng.randrange(1, 5)))
    labels = {tuple(rng.randrange(50, 60) for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(2, 7))}
    return _layout(name, prefix, suffix, tuple(sorted(labels)), strategy)


def _chunky_prompts(rng: random.Random) -> list[PromptLayout]:
    """Prefixes (blocks of 16) with a 32-token block run shared by three prompts, one prefix of exactly
    32 tokens (the shared run alone), one of 16 own tokens, one with none, one of 65 tokens."""
    header = tuple(rng.randrange(1000) for _ in range(40))
    own = lambda k: tuple(rng.randrange(1000) for _ in range(k))  # noqa: E731
    prefixes = [header + own(10), (), header[:32], own(16), header + own(25)]
    return [_with_labels(rng, f"c{i}", p) for i, p in enumerate(prefixes)]


def _compare(device, dtype, heads, kv_heads, head_dim, prompts, batch, seed, tol, tunings, window=0):
    rng = random.Random(seed)
    pool = plan_prefixes([p.tokens.prefix_ids for p in prompts], 16)
    pool_len = pool.n_slots + (-pool.n_slots) % 8
    packer = Packer(prompts, pool, pool_len)
    queries = [[rng.randrange(1000) for _ in range(rng.randrange(1, 20))] for _ in range(batch)]
    total = sum(map(len, queries))
    n = packer.n_tokens(batch, total) + rng.randrange(0, 40)  # and some padding
    buf = torch.zeros(packer.buffer_len(batch, n), dtype=torch.long)
    packer.pack(queries, n, buf)
    d = unpack(buf.to(device), n, packer.n_reads(batch), len(prompts))
    key_len = pool_len + n + (-(pool_len + n)) % 16
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, heads, head_dim, generator=g).to(device, dtype)
    k = torch.randn(kv_heads, key_len + 8, head_dim, generator=g).to(device, dtype)
    v = torch.randn(kv_heads, key_len + 8, head_dim, generator=g).to(device, dtype)
    visible, slot_pos = packer.visible.to(device), packer.slot_pos.to(device)
    dense = A.DenseAttention(lambda w: build_mask(d, visible, key_len, w, slot_pos), key_len)(q, k, v, window=window)
    used = int((d["prompt"] < len(prompts)).sum())
    outs = []
    for tuning in tunings:
        plan = plan_tree(packer, batch, total, heads // kv_heads, tuning).to(device)
        tree = A.TreeAttention(d, plan, pool_len, heads, head_dim, dtype)
        tree.out.fill_(float("nan"))
        got = tree(q, k, v, window=window).clone()
        assert torch.isfinite(got).all()  # pads too: they are never read but must not poison anything
        err = (got[:used].float() - dense[:used].float()).abs().max().item()
        assert err <= tol, f"{tuning}: max |Δ| {err} against dense"
        outs.append((plan, got))
    return outs


CASES = [  # heads, kv heads, head_dim, prompts, batch, strategy
    (4, 2, 16, 2, 1, "trie"),
    (3, 1, 32, 3, 2, "exact"),  # group of 3 (padded to 4 inside the kernel)
    (2, 2, 16, 8, 4, "trie"),  # no GQA, 8 prompts, 4 queries: rows longer than one tile
    (8, 2, 16, 4, 3, "mean_logprob"),
]


@needs_triton
@pytest.mark.parametrize("case", CASES)
def test_tree_attention_equals_dense_interpreted(case):
    if torch.cuda.is_available():
        pytest.skip("the GPU run is test_tree_attention_equals_dense_gpu")
    heads, kv, dim, n_prompts, batch, strategy = case
    for seed in range(2):
        prompts = _random_prompts(random.Random(seed), n_prompts, strategy)
        _compare("cpu", torch.float32, heads, kv, dim, prompts, batch, seed, 1e-4, [INLINE, split(16, 2)])


SPLIT_CASES = [  # heads, kv heads, head_dim, batch, window, chunk, query blocks per program, row pass tokens
    (2, 2, 64, 1, 0, 16, 1, 16),  # no GQA; chunks = blocks
    (4, 2, 128, 2, 30, 8, 2, 16),  # chunk boundaries inside shared blocks; a window shorter than the prefixes
    (4, 1, 256, 3, 5, 32, 1, 8),  # group of 4, d=256, tiles in two passes; the 32-token prefix is one chunk;
    # a window inside the rows
    (8, 2, 64, 4, 0, 16, 3, 16),  # 4 queries: several query blocks per chunk, three per program
    (3, 1, 128, 2, 12, 16, 1, 16),  # group of 3; window crossing from the prefix into the rows
    (2, 1, 256, 1, 0, 8, 2, 16),  # group of 2, d=256
]


@needs_triton
@pytest.mark.parametrize("case", SPLIT_CASES)
def test_split_prefix_equals_unsplit_and_dense_interpreted(case):
    if torch.cuda.is_available():
        pytest.skip("the GPU run is test_split_prefix_equals_dense_gpu")
    heads, kv, dim, batch, window, chunk, qb, row_bt = case
    prompts = _chunky_prompts(random.Random(batch))
    (plan_s, got_s), (plan_u, got_u), (plan_i, got_i) = _compare(
        "cpu", torch.float32, heads, kv, dim, prompts, batch, batch, 1e-4,
        [split(chunk, qb, row_bt), split(chunk, qb, row_bt, unmasked=True), INLINE.with_(row_bt=row_bt)], window)
    assert plan_s.work.shape[0] and plan_s.max_splits == -(-65 // chunk) and not plan_i.work.shape[0]
    assert (got_s - got_i).abs().max().item() <= 1e-5 and (got_u - got_i).abs().max().item() <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES + [(32, 8, 128, 8, 4, "trie"), (16, 4, 64, 8, 1, "exact")])
def test_tree_attention_equals_dense_gpu(case):
    if not torch.cuda.is_available() or A.triton is None:
        pytest.skip("needs a CUDA GPU with Triton")
    heads, kv, dim, n_prompts, batch, strategy = case
    for seed in range(3):
        prompts = _random_prompts(random.Random(seed), n_prompts, strategy)
        _compare("cuda", torch.float16, heads, kv, dim, prompts, batch, seed, 2e-3, [INLINE, split(16, 2)])


def test_turing_shapes_fit_its_registers(monkeypatch):
    """On sm_75 a program holds at most 8192 / head_dim query vectors (tokens × padded group), in tiles of
    ≤ 16 tokens, so the FMA dots neither spill nor pass 48 KiB of shared memory (checked with ptxas)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    for dim, group, bq, row_bt in [(128, 4, 16, 16), (256, 4, 8, 8), (256, 2, 16, 16), (128, 1, 64, 16),
                                   (64, 3, 32, 16)]:
        t = tuning_for(dim, group, torch.device("cuda"))
        assert (t.bq, t.row_bt, t.bn, t.warps) == (bq, row_bt, 16, 8), (dim, group)
    assert tuning_for(128, 4, torch.device("cpu")) == tuning_for(128, 4)  # elsewhere: the measured table


@needs_triton
def test_turing_shapes_compute_the_same_interpreted(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("the GPU run is test_split_prefix_equals_dense_gpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    t4 = tuning_for(256, 4, torch.device("cuda"))
    prompts = _chunky_prompts(random.Random(5))
    _compare("cpu", torch.float32, 4, 1, 256, prompts, 2, 5, 1e-4,
             [t4.with_(inline_reads=0, min_chunk=32, max_chunk=32, partial_limit=1e9), t4], window=20)


@pytest.mark.gpu
@pytest.mark.parametrize("case", SPLIT_CASES + [(32, 8, 128, 4, 0, 64, 4, 16), (4, 1, 256, 4, 24, 32, 2, 8),
                                                (8, 4, 256, 2, 0, 128, 1, 16)])
def test_split_prefix_equals_dense_gpu(case):
    """Also with the kernel shapes this GPU ships with (tree_plan.tuning_for)."""
    if not torch.cuda.is_available() or A.triton is None:
        pytest.skip("needs a CUDA GPU with Triton")
    heads, kv, dim, batch, window, chunk, qb, row_bt = case
    shipped = tuning_for(dim, heads // kv, torch.device("cuda"))
    prompts = _chunky_prompts(random.Random(batch))
    _compare("cuda", torch.float16, heads, kv, dim, prompts, batch, batch, 2e-3,
             [split(chunk, qb, row_bt), split(chunk, qb, row_bt, unmasked=True),
              shipped.with_(inline_reads=0, min_chunk=chunk, max_chunk=chunk, partial_limit=1e9),
              shipped.with_(inline_reads=0, min_chunk=chunk, max_chunk=chunk, partial_limit=1e9, unmasked=False),
              shipped.with_(inline_reads=1 << 30)], window)


@needs_triton
def test_tree_refused_where_it_cannot_run():
    assert "power of two" in A.tree_available(torch.device("cpu"), 96)
