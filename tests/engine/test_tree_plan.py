"""The tree kernels' per-bucket plan: prefix chunks, the prompts that see each, work items."""
from __future__ import annotations

import pytest

from qcls.engine.layout import Packer
from qcls.engine.prefix_cache import plan_prefixes
from qcls.engine.tree_plan import (Tuning, crowded, head_split, inline_reads, plan_chunks, plan_tree, prefix_runs,
                                   row_programs, tuning_for, widened)
from tests.engine.test_layout import _layout

HEADER = tuple(range(100, 140))  # 40 tokens: two full shared blocks of 16, then 8 in a mixed block


def _packer(prefixes):
    prompts = [_layout(p, (4,), ((5,), (6,))) for p in prefixes]
    pool = plan_prefixes(list(prefixes), 16)
    return Packer(prompts, pool, pool.n_slots + (-pool.n_slots) % 8)


def test_prompts_sharing_blocks_are_neighbours_and_a_shared_run_is_one_chunk_list():
    prefixes = [HEADER + (1,) * 10, (), (7,) * 16, HEADER[:32], HEADER + (2,) * 25]
    packer = _packer(prefixes)
    order = packer.order
    assert order[0] == 1  # no prefix sorts first
    ranks = sorted(order.index(p) for p in (0, 3, 4))
    assert ranks == list(range(ranks[0], ranks[0] + 3))  # the three sharing HEADER[:32] are contiguous
    chunks, n_splits = plan_chunks(packer.pool, order, lambda lo, hi: 16)
    shared = [c for c in chunks if c.hi - c.lo == 3]
    assert [(c.keys, c.pos, c.split) for c in shared] == [(16, 0, 0), (16, 16, 1)]  # emitted once, for all three
    own = {order[c.lo]: [] for c in chunks if c.hi - c.lo == 1}
    for c in chunks:
        if c.hi - c.lo == 1:
            own[order[c.lo]].append((c.keys, c.pos, c.split))
    # after the shared run, each prompt's own keys continue its split count and positions
    assert own[0] == [(16, 32, 2), (2, 48, 3)] and own[4] == [(16, 32, 2), (16, 48, 3), (1, 64, 4)]
    assert own[2] == [(16, 0, 0)] and 3 not in own and 1 not in own
    assert n_splits == [4, 0, 1, 2, 5]
    for c in chunks:  # each chunk's keys are contiguous pool slots holding exactly its positions
        for p in order[c.lo:c.hi]:
            slots = packer.pool.prompt_slots(p)
            assert slots[c.pos:c.pos + c.keys] == list(range(c.slot, c.slot + c.keys))


def test_chunk_size_follows_the_tokens_that_see_it_and_short_prefixes_stay_inline():
    packer = _packer([HEADER * 8 + (1,), HEADER * 8 + (2,), (3,) * 300])  # 321, 321 and 300 tokens
    t = Tuning(inline_reads=256, partial_ratio=0.5, min_chunk=32, max_chunk=256, bq=16, qb=2)
    plan = plan_tree(packer, 2, 12, 4, t)
    tokens = packer.prompt_tokens(2, 12)  # 12 query tokens + 2 rows × (1 suffix + 1 trie token... )
    by_range = {}
    for c in plan.chunks:
        by_range.setdefault(c.hi - c.lo, []).append(c.keys)
    # a run two prompts see: 2 × tokens × 4 heads / 0.5 → a bigger chunk than a run one prompt sees
    want_one = min(256, max(32, 1 << (tokens[2] * 4 * 2 - 1).bit_length()))
    assert max(by_range[1]) == want_one and max(by_range[2]) >= max(by_range[1])
    assert plan.work.shape[1] == 7 and plan.max_splits == max(plan.n_splits.tolist())
    assert plan.inline_runs.sum() == 0
    blocks = {(c.slot, c.split): -(-sum(tokens[p] for p in [packer.order[i] for i in range(c.lo, c.hi)]) // 16)
              for c in plan.chunks}
    for c in plan.chunks:  # every query block of every chunk is in exactly one work item
        items = [w for w in plan.work.tolist() if (w[0], w[3]) == (c.slot, c.split)]
        assert [w[6] for w in items] == list(range(0, blocks[c.slot, c.split], 2))
    two = _packer([(1,) * 200, (2,) * 100])
    reads = inline_reads([200, 100], two.prompt_tokens(4, 64), 4)
    assert plan_tree(two, 4, 64, 4, t.with_(inline_reads=reads - 1)).work.shape[0] > 0
    short = plan_tree(two, 4, 64, 4, t.with_(inline_reads=reads))
    assert short.work.shape[0] == 0 and short.inline_runs.tolist() == [1, 1, 0]
    assert short.runs[:2, 0, 1:].tolist() == [[200, 0], [100, 0]]  # (keys, position of the first) of each run


def test_inline_reads_count_each_prompts_keys_once_per_tile():
    # 40 tokens: 3 tiles of 16 at batch 1; at batch 4 at least one tile per row
    assert inline_reads([200, 100], [40, 10], 1) == 600
    assert inline_reads([200, 100], [40, 10], 4) == 800
    assert inline_reads([0, 0], [40, 10], 2) == 0


def test_prefix_runs_cover_each_prefix_in_order_with_contiguous_slots():
    """The inline walk's runs: a prompt's slots, in prefix order, as maximal contiguous runs (a shared block
    and the prompt's own blocks after it sit apart in the pool)."""
    prefixes = [HEADER + (1,) * 10, (), (7,) * 16, HEADER[:32], HEADER + (2,) * 25]
    packer = _packer(prefixes)
    runs, n = prefix_runs(packer.pool)
    assert n.tolist()[-1] == 0 and runs.shape[0] == len(prefixes) + 1
    for p in range(len(prefixes)):
        got = [s for slot, keys, _ in runs[p, :n[p]].tolist() for s in range(slot, slot + keys)]
        assert got == packer.pool.prompt_slots(p)  # every slot once, in prefix order
        starts = [pos for _, _, pos in runs[p, :n[p]].tolist()]
        assert starts == [sum(runs[p, :i, 1].tolist()) for i in range(n[p])]  # positions continue run to run
        ends = [slot + keys for slot, keys, _ in runs[p, :n[p]].tolist()]
        assert all(e != s for e, (s, _, _) in zip(ends, runs[p, 1:n[p]].tolist()))  # maximal: no run continues
    # prompt 0's own blocks were placed right after the shared ones (one run), prompt 4's elsewhere (two)
    assert n.tolist()[:5] == [1, 0, 1, 1, 2]


def test_chunk_cap_never_lets_partials_outweigh_keys():
    """A big bucket (many query tokens per prompt) gets chunks at least as long as the query vectors that
    see them, whatever max_chunk says: its partial states never cost more bytes than the keys
    (partial_limit=1)."""
    packer = _packer([(3,) * 1500, (4,) * 1500])
    t = Tuning(inline_reads=0, partial_ratio=0.25, min_chunk=64, max_chunk=128, bq=16, qb=1)
    small, big = plan_tree(packer, 1, 8, 4, t), plan_tree(packer, 4, 256, 4, t)
    assert max(c.keys for c in small.chunks) == 128  # capped: 9 tokens × 4 heads / 0.25 would ask for 256
    vectors = packer.prompt_tokens(4, 256)[0] * 4
    assert max(c.keys for c in big.chunks) >= vectors
    assert big.max_splits < small.max_splits


def test_merge_warps_only_where_batch_one_prefixes_are_split():
    packer = _packer([(3,) * 300, (4,) * 300])
    t = Tuning(inline_reads=0, row_warps=4, merge_warps=8)
    assert plan_tree(packer, 1, 8, 4, t).tuning.row_warps == 8  # split, one tile per prompt: 8 warps merge
    assert plan_tree(packer, 4, 32, 4, t).tuning.row_warps == 4  # batch 4: enough tiles already
    assert plan_tree(packer, 1, 8, 4, t.with_(inline_reads=1 << 30)).tuning.row_warps == 4  # walked inline
    assert plan_tree(packer, 1, 8, 4, t.with_(merge_warps=0)).tuning.row_warps == 4


def test_query_heads_split_only_in_batch_one_buckets():
    packer = _packer([(3,) * 40, (4,) * 40])
    t = Tuning(row_head_split=2)
    assert plan_tree(packer, 1, 8, 4, t).tuning.row_head_split == 2  # one row per prompt: a small grid
    assert plan_tree(packer, 1, 8, 4, t.with_(inline_reads=0)).tuning.row_head_split == 2  # split prefixes too
    assert plan_tree(packer, 2, 16, 4, t).tuning.row_head_split == 1
    assert plan_tree(packer, 4, 32, 4, t).tuning.row_head_split == 1


def test_row_programs_count_tiles_of_an_even_split_per_kv_head():
    # batch 4, 24 query tokens: 6 per query; a prompt of 4 × 13 + 24 = 76 tokens has rows of 19 → 2 tiles each
    assert row_programs([76], 4, 1) == 8
    assert row_programs([76, 40], 4, 8) == 8 * (8 + 4)  # 40 / 4 = 10 tokens a row: one tile each
    assert row_programs([17], 1, 2) == 2 * 2  # one row of 17: two tiles
    assert row_programs([33], 2, 1) == 2 * 2  # ⌈33 / 2⌉ = 17 tokens a row: two tiles each


def test_register_limit_only_in_crowded_buckets():
    t = Tuning(row_maxnreg=168, row_crowded=2.0, sms=10)
    assert crowded(t, [76, 40], 4, 2).row_maxnreg == 168  # 24 programs > 2 × 10
    assert crowded(t, [76, 40], 4, 1).row_maxnreg == 0  # 12 programs ≤ 20
    assert crowded(t.with_(sms=0), [76, 40], 4, 2).row_maxnreg == 0  # SMs unknown (CPU): never limited
    assert crowded(t, [76, 40], 4, 0).row_maxnreg == 0  # KV heads not given
    assert head_split(t.with_(row_head_split=2), 4) == 2 and head_split(t.with_(row_head_split=2), 3) == 1
    assert head_split(t.with_(row_head_split=8), 4) == 4 and head_split(t, 4) == 1
    keys = t.with_(row_keys_in_registers=True)  # under the limit the row's keys go through the KV buffer
    assert not crowded(keys, [76, 40], 4, 2).row_keys_in_registers and crowded(keys, [76, 40], 4, 1).row_keys_in_registers
    packer = _packer([(3,) * 40, (4,) * 40])
    programs = row_programs(packer.prompt_tokens(4, 64), 4, 8)
    assert plan_tree(packer, 4, 64, 4, t.with_(sms=programs // 2 - 1), 8).tuning.row_maxnreg == 168
    assert plan_tree(packer, 4, 64, 4, t.with_(sms=programs // 2), 8).tuning.row_maxnreg == 0
    assert tuning_for(128, 4).sms == 0 and tuning_for(128, 4).row_maxnreg  # no device: the limit, never applied


def test_wide_tiles_only_where_the_narrow_ones_crowd_the_sms_and_the_wide_fit():
    # rows of ⌈76 / 4⌉ = 19 tokens: 2 tiles of 16 each, 1 of 32; 2 prompts × 4 rows × 2 KV heads
    t = Tuning(row_maxnreg=96, row_crowded=1.0, wide_tile=32, sms=20, row_early_q=True, row_early_kv=True,
               row_values_with_keys=True)
    assert row_programs([76, 76], 4, 2) == 32 and row_programs([76, 76], 4, 2, 32) == 16
    w = widened(t, [76, 76], 4, 2)  # 32 programs > 20 SMs, 16 ≤ 20: one pass of 32 tokens, no register limit …
    assert (w.row_tile, w.row_bt, w.row_maxnreg) == (32, 32, 0)
    # … and none of the early loads (held through a 32-token tile, they spill)
    assert (w.row_early_q, w.row_early_kv, w.row_values_with_keys) == (False, False, False)
    assert widened(t.with_(sms=40), [76, 76], 4, 2) == t.with_(sms=40)  # 32 programs fit 40 SMs: not crowded
    assert widened(t.with_(sms=15), [76, 76], 4, 2) == t.with_(sms=15)  # 16 wide ones would not fit 15 either
    assert widened(t.with_(wide_tile=0), [76, 76], 4, 2).row_tile == 16  # off
    assert widened(t.with_(sms=0), [76, 76], 4, 2).row_tile == 16  # SMs unknown (CPU)
    assert widened(t, [76, 76], 1, 8).row_tile == 16  # batch 1: the head split's business
    packer = _packer([(3,) * 40, (4,) * 40])
    tokens = packer.prompt_tokens(4, 64)
    sms = row_programs(tokens, 4, 2) - 1
    assert row_programs(tokens, 4, 2, 32) <= sms
    plan = plan_tree(packer, 4, 64, 4, t.with_(sms=sms), 2)
    assert (plan.tuning.row_tile, plan.tuning.row_maxnreg) == (32, 0)
    assert plan_tree(packer, 4, 64, 4, t.with_(sms=sms + 1), 2).tuning.row_tile == 16
    with pytest.raises(ValueError, match="tiles of 64 tokens"):  # a tile the Packer holds no templates for
        plan_tree(packer, 4, 64, 4, Tuning(row_tile=64, row_bt=16), 2)
