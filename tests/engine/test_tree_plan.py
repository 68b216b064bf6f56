"""The tree kernels' per-bucket plan: prefix chunks, the prompts that see each, work items."""
from __future__ import annotations

from qcls.engine.layout import Packer
from qcls.engine.prefix_cache import plan_prefixes
from qcls.engine.tree_plan import Tuning, plan_chunks, plan_tree
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
    t = Tuning(inline_max=256, partial_ratio=0.5, min_chunk=32, max_chunk=256, bq=16, qb=2)
    plan = plan_tree(packer, 2, 12, 4, t)
    tokens = packer.prompt_tokens(2, 12)  # 12 query tokens + 2 rows × (1 suffix + 1 trie token... )
    by_range = {}
    for c in plan.chunks:
        by_range.setdefault(c.hi - c.lo, []).append(c.keys)
    # a run two prompts see: 2 × tokens × 4 heads / 0.5 → a bigger chunk than a run one prompt sees
    want_one = min(256, max(32, 1 << (tokens[2] * 4 * 2 - 1).bit_length()))
    assert max(by_range[1]) == want_one and max(by_range[2]) >= max(by_range[1])
    assert plan.work.shape[1] == 7 and plan.max_splits == max(plan.n_splits.tolist())
    assert plan.inline_len.sum() == 0
    blocks = {(c.slot, c.split): -(-sum(tokens[p] for p in [packer.order[i] for i in range(c.lo, c.hi)]) // 16)
              for c in plan.chunks}
    for c in plan.chunks:  # every query block of every chunk is in exactly one work item
        items = [w for w in plan.work.tolist() if (w[0], w[3]) == (c.slot, c.split)]
        assert [w[6] for w in items] == list(range(0, blocks[c.slot, c.split], 2))
    short = plan_tree(_packer([(1,) * 200, (2,) * 100]), 4, 64, 4, t)
    assert short.work.shape[0] == 0 and short.inline_len.tolist() == [200, 100, 0]


def test_chunk_cap_never_lets_partials_outweigh_keys():
    """A big bucket (many query tokens per prompt) gets chunks at least as long as the query vectors that
    see them, whatever max_chunk says: its partial states never cost more bytes than the keys
    (partial_limit=1)."""
    packer = _packer([(3,) * 1500, (4,) * 1500])
    t = Tuning(inline_max=0, partial_ratio=0.25, min_chunk=64, max_chunk=128, bq=16, qb=1)
    small, big = plan_tree(packer, 1, 8, 4, t), plan_tree(packer, 4, 256, 4, t)
    assert max(c.keys for c in small.chunks) == 128  # capped: 9 tokens × 4 heads / 0.25 would ask for 256
    vectors = packer.prompt_tokens(4, 256)[0] * 4
    assert max(c.keys for c in big.chunks) >= vectors
    assert big.max_splits < small.max_splits
