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


def limited(head_dim: int, group: int) -> Tuning:
    """This GPU's shipped shapes with the row kernel's register limit (tree_plan's crowded buckets) in every bucket
    (a limit that makes ptxas spill where the shipped one does not)."""
    t = tuning_for(head_dim, group, torch.device("cuda"))
    return t.with_(row_maxnreg=t.row_maxnreg or 128, row_crowded=0.0, inline_reads=1 << 30)


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


def _packed(device, prompts, batch, seed, tile=A.TILE):
    """A random batch of `batch` queries packed for these prompts (plus some padding) in attention tiles of `tile`
    tokens: (packer, pool_len, descriptors, tokens, query tokens, key_len); the same tokens for every tile."""
    rng = random.Random(seed)
    pool = plan_prefixes([p.tokens.prefix_ids for p in prompts], 16)
    pool_len = pool.n_slots + (-pool.n_slots) % 8
    packer = Packer(prompts, pool, pool_len)
    queries = [[rng.randrange(1000) for _ in range(rng.randrange(1, 20))] for _ in range(batch)]
    total = sum(map(len, queries))
    n = packer.n_tokens(batch, total) + rng.randrange(0, 40)
    buf = torch.zeros(packer.buffer_len(batch, n), dtype=torch.long)
    packer.pack(queries, n, buf, tile)
    d = unpack(buf.to(device), n, packer.n_reads(batch), len(prompts))
    return packer, pool_len, d, n, total, pool_len + n + (-(pool_len + n)) % 16


def _compare(device, dtype, heads, kv_heads, head_dim, prompts, batch, seed, tol, tunings, window=0):
    packer, pool_len, d, n, total, key_len = _packed(device, prompts, batch, seed)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, heads, head_dim, generator=g).to(device, dtype)
    k = torch.randn(kv_heads, key_len + 8, head_dim, generator=g).to(device, dtype)
    v = torch.randn(kv_heads, key_len + 8, head_dim, generator=g).to(device, dtype)
    visible, slot_pos = packer.visible.to(device), packer.slot_pos.to(device)
    dense = A.DenseAttention(lambda w: build_mask(d, visible, key_len, w, slot_pos), key_len)(q, k, v, window=window)
    used = int((d["prompt"] < len(prompts)).sum())
    outs = []
    for tuning in tunings:
        plan = plan_tree(packer, batch, total, heads // kv_heads, tuning, kv_heads).to(device)
        _, _, d, _, _, _ = _packed(device, prompts, batch, seed, plan.tuning.row_tile)  # the plan's tiles
        if tuning.sms and tuning.row_maxnreg and not tuning.row_crowded:
            assert plan.tuning.row_maxnreg == tuning.row_maxnreg  # every bucket crowded: launched with the limit
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


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("case", CASES)
def test_tree_attention_equals_dense_interpreted(case):
    if torch.cuda.is_available():
        pytest.skip("the GPU run is test_tree_attention_equals_dense_gpu")
    heads, kv, dim, n_prompts, batch, strategy = case
    # two draws of prompts where they are small; the 8-prompt case is one draw (interpreted, each is half a minute
    # of a CPU; the GPU test draws three)
    for seed in range(1 if n_prompts >= 8 else 2):
        prompts = _random_prompts(random.Random(seed), n_prompts, strategy)
        _compare("cpu", torch.float32, heads, kv, dim, prompts, batch, seed, 1e-4,
                 [INLINE, split(16, 2), INLINE.with_(row_maxnreg=128, row_crowded=0.0, sms=1),
                  # the group's query heads over 2 programs (a group of 3 or 1 cannot split: 1 program), inline and
                  # merging split prefixes
                  INLINE.with_(row_head_split=2), split(16, 2).with_(row_head_split=4),
                  # tiles of 32 tokens (Tuning.row_tile): in one pass, and in two passes merging split prefixes
                  INLINE.with_(row_tile=32, row_bt=32), split(16, 2).with_(row_tile=32, row_head_split=2),
                  # the index loads after the rotation (sm_75's order), in two passes of a tile
                  INLINE.with_(row_early_loads=False, row_tile=32, row_bt=16),
                  # the query vectors and the prefix's first step loaded before the row's keys, values with keys
                  INLINE.with_(row_early_q=True, row_early_kv=True, row_values_with_keys=True),
                  INLINE.with_(row_early_kv=True, row_tile=32, row_bt=16),
                  # the prefix's first step asked early without the other early loads: the kernel leaves it off
                  INLINE.with_(row_early_loads=False, row_early_kv=True)])


@pytest.mark.slow
@needs_triton
def test_wide_tiles_where_narrow_ones_crowd_the_sms_interpreted():
    """Tuning.wide_tile through the plan (tree_plan.widened): 8 prompts × 4 queries, rows longer than 16 tokens, SMs
    set so that the 16-token tiles crowd them and the 32-token ones fit; packed in the plan's tiles, as the engine does."""
    from qcls.engine.tree_plan import row_programs
    if torch.cuda.is_available():
        pytest.skip("a CPU (interpreter) test")
    prompts = _random_prompts(random.Random(3), 8, "trie")
    packer, _, _, _, total, _ = _packed("cpu", prompts, 4, 3)
    tokens = packer.prompt_tokens(4, total)
    sms = row_programs(tokens, 4, 2, 32)
    assert row_programs(tokens, 4, 2) > sms  # (the case: 16-token tiles crowd them)
    wide = INLINE.with_(wide_tile=32, sms=sms)
    (plan, _), (plan16, _) = _compare("cpu", torch.float32, 4, 2, 16, prompts, 4, 3, 1e-4, [wide, wide.with_(wide_tile=0)])
    assert (plan.tuning.row_tile, plan.tuning.row_bt, plan16.tuning.row_tile) == (32, 32, 16)  # both equal dense


SPLIT_CASES = [  # heads, kv heads, head_dim, batch, window, chunk, query blocks per program, row pass tokens
    (2, 2, 64, 1, 0, 16, 1, 16),  # no GQA; chunks = blocks
    (4, 2, 128, 2, 30, 8, 2, 16),  # chunk boundaries inside shared blocks; a window shorter than the prefixes
    (4, 1, 256, 3, 5, 32, 1, 8),  # group of 4, d=256, tiles in two passes; the 32-token prefix is one chunk;
    # a window inside the rows
    (8, 2, 64, 4, 0, 16, 3, 16),  # 4 queries: several query blocks per chunk, three per program
    (3, 1, 128, 2, 12, 16, 1, 16),  # group of 3; window crossing from the prefix into the rows
    (2, 1, 256, 1, 0, 8, 2, 16),  # group of 2, d=256
]


@pytest.mark.slow
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
        _compare("cuda", torch.float16, heads, kv, dim, prompts, batch, seed, 2e-3,
                 [INLINE, split(16, 2), limited(dim, heads // kv), INLINE.with_(row_head_split=2),
                  tuning_for(dim, heads // kv, torch.device("cuda")).with_(row_head_split=2),
                  INLINE.with_(row_tile=32, row_bt=32), INLINE.with_(row_tile=32, row_bt=32, row_warps=16)])


def test_turing_shapes_fit_its_registers(monkeypatch):
    """On sm_75 a program holds at most 8192 / head_dim query vectors (tokens × padded group), in tiles of
    ≤ 16 tokens, so the FMA dots neither spill nor pass 48 KiB of shared memory (checked with ptxas)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    for dim, group, bq, row_bt in [(128, 4, 16, 16), (256, 4, 8, 8), (256, 2, 16, 16), (128, 1, 64, 16),
                                   (64, 3, 32, 16)]:
        t = tuning_for(dim, group, torch.device("cuda"))
        assert (t.bq, t.row_bt, t.bn, t.warps) == (bq, row_bt, 16, 8), (dim, group)
    assert tuning_for(128, 4, torch.device("cpu")) == tuning_for(128, 4)  # elsewhere: the measured table


@pytest.mark.slow
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
              shipped.with_(inline_reads=1 << 30), limited(dim, heads // kv).with_(inline_reads=0, min_chunk=chunk,
                                                                                   max_chunk=chunk, partial_limit=1e9)],
             window)


def _compare_fused(device, dtype, heads, kv_heads, head_dim, prompts, batch, seed, tol, tunings, window=0,
                   norm=True, offset=False):
    """The kernels fed the QKV GEMM's raw q/k/v (RawQKV: they norm and rotate q in registers, and the row's keys
    in registers or through the KV buffer, Tuning.row_keys_in_registers) against the q/k/v kernel's torch version
    followed by dense SDPA. The query buffer and this forward's KV slots start as NaN: what a kernel read before
    writing shows as NaN. The query buffer stays untouched; the KV slots too, unless the keys go through them."""
    from qcls.engine.qkv_kernels import rope_torch
    packer, pool_len, d, n, total, key_len = _packed(device, prompts, batch, seed)
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device, dtype)  # noqa: E731
    qkv = rand(n, (heads + 2 * kv_heads) * head_dim)  # one GEMM's output: q, k, v side by side
    qr, kr, vr = (x.view(n, -1, head_dim) for x in qkv.split([heads * head_dim, kv_heads * head_dim,
                                                             kv_heads * head_dim], -1))
    positions = int(d["pos"].max()) + 1
    angle = torch.arange(positions)[:, None] * (1e-2 ** (torch.arange(head_dim // 2) / (head_dim // 2)))[None]
    cos, sin = (torch.cat([f(angle)] * 2, -1).to(device, dtype) for f in (torch.cos, torch.sin))
    qw, kw = (rand(head_dim), rand(head_dim)) if norm else (None, None)
    k = rand(kv_heads, key_len + 8, head_dim)  # the prefix pool's K/V; the forward's slots are written below
    v = rand(kv_heads, key_len + 8, head_dim)
    slots = torch.arange(pool_len, pool_len + n, device=device)
    k[:, slots], v[:, slots] = float("nan"), float("nan")
    k_ref, v_ref = k.clone(), v.clone()
    pos = d["pos"]
    q_ref = rope_torch(qr, cos[pos], sin[pos], qw, 1e-6, offset)
    k_ref[:, slots] = rope_torch(kr, cos[pos], sin[pos], kw, 1e-6, offset).transpose(0, 1)
    v_ref[:, slots] = vr.transpose(0, 1)
    visible, slot_pos = packer.visible.to(device), packer.slot_pos.to(device)
    dense = A.DenseAttention(lambda w: build_mask(d, visible, key_len, w, slot_pos), key_len)(
        q_ref, k_ref, v_ref, window=window)
    used = int((d["prompt"] < len(prompts)).sum())
    for tuning in tunings:
        plan = plan_tree(packer, batch, total, heads // kv_heads, tuning, kv_heads).to(device)
        _, _, d, _, _, _ = _packed(device, prompts, batch, seed, plan.tuning.row_tile)  # the plan's tiles
        tree = A.TreeAttention(d, plan, pool_len, heads, head_dim, dtype)
        q, kf, vf = torch.full_like(q_ref, float("nan")), k.clone(), v.clone()
        raw = A.RawQKV(qr, kr, vr, cos[pos], sin[pos], qw, kw, 1e-6, offset)
        got = tree(q, kf, vf, window=window, raw=raw).clone()
        assert torch.isfinite(got).all()
        err = (got[:used].float() - dense[:used].float()).abs().max().item()
        assert err <= tol, f"{tuning}: max |Δ| {err} against the q/k/v kernel + dense"
        assert torch.isnan(q).all()  # the query buffer is neither written nor needed
        if plan.tuning.row_keys_in_registers:  # (the plan's: a crowded bucket sends the keys through the buffer)
            for got_buf, before in ((kf, k), (vf, v)):
                assert torch.equal(got_buf.isnan(), before.isnan()) and torch.equal(got_buf.nan_to_num(),
                                                                                    before.nan_to_num())
        else:  # every key the rows read was written, equal to the q/k/v kernel's
            assert (kf[:, pool_len:pool_len + used] - k_ref[:, pool_len:pool_len + used]).abs().max().item() <= tol
            assert torch.equal(vf[:, pool_len:pool_len + used], v_ref[:, pool_len:pool_len + used])


FUSED_CASES = [  # heads, kv heads, head_dim, batch, window, q/k norm, Gemma3's (1 + w)
    (4, 2, 16, 1, 0, True, False),
    (3, 1, 32, 2, 12, False, False),  # no q/k norm (Llama, Qwen2); group of 3; a window
    (2, 1, 256, 3, 0, True, True),  # d=256, Gemma3's norms
]


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("case", FUSED_CASES)
def test_fused_qkv_equals_qkv_kernel_then_dense_interpreted(case):
    """engine.fuse_qkv_attention: prefixes walked inline and split (the prefix kernel rotates its queries)."""
    if torch.cuda.is_available():
        pytest.skip("the GPU run is test_fused_qkv_equals_qkv_kernel_then_dense_gpu")
    heads, kv, dim, batch, window, norm, offset = case
    prompts = _chunky_prompts(random.Random(batch))
    _compare_fused("cpu", torch.float32, heads, kv, dim, prompts, batch, batch, 1e-4,
                   [INLINE, INLINE.with_(row_keys_in_registers=True), INLINE.with_(row_head_split=2),
                    # a crowded bucket (register limit): the keys go through the KV buffer after all
                    INLINE.with_(row_keys_in_registers=True, row_maxnreg=128, row_crowded=0.0, sms=1),
                    split(16, 2, 8 if dim == 256 else 16),
                    split(16, 2, 8 if dim == 256 else 16).with_(row_keys_in_registers=True),
                    INLINE.with_(row_tile=32, row_bt=32 if dim < 256 else 16),
                    INLINE.with_(row_tile=32, row_bt=16, row_early_loads=False),
                    INLINE.with_(row_early_q=True, row_early_kv=True, row_values_with_keys=True),
                    INLINE.with_(row_early_q=True, row_early_kv=True, row_keys_in_registers=True, row_tile=32,
                                 row_bt=16, row_values_with_keys=True)], window, norm, offset)


@pytest.mark.gpu
@pytest.mark.parametrize("case", FUSED_CASES + [(32, 8, 128, 4, 0, True, False), (8, 4, 256, 4, 20, True, True)])
def test_fused_qkv_equals_qkv_kernel_then_dense_gpu(case):
    """Also with the kernel shapes this GPU ships with (tree_plan.tuning_for), inline and split."""
    if not torch.cuda.is_available() or A.triton is None:
        pytest.skip("needs a CUDA GPU with Triton")
    heads, kv, dim, batch, window, norm, offset = case
    shipped = tuning_for(dim, heads // kv, torch.device("cuda"))
    prompts = _chunky_prompts(random.Random(batch))
    _compare_fused("cuda", torch.float16, heads, kv, dim, prompts, batch, batch, 4e-3,
                   [shipped.with_(inline_reads=1 << 30), shipped.with_(inline_reads=0, min_chunk=32, max_chunk=32,
                                                                       partial_limit=1e9), split(16, 2),
                    limited(dim, heads // kv), shipped.with_(row_keys_in_registers=not shipped.row_keys_in_registers),
                    shipped.with_(row_head_split=2), shipped.with_(row_tile=32, row_bt=32, row_warps=16, row_maxnreg=0),
                    shipped.with_(wide_tile=0)],
                   window, norm, offset)


@needs_triton
def test_tree_refused_where_it_cannot_run():
    assert "power of two" in A.tree_available(torch.device("cpu"), 96)
