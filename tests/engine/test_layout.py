"""The packed row layout and the mask built from its descriptors, on a hand-made prompt."""
from __future__ import annotations

import torch

from qcls.engine.layout import Packer, PromptLayout, build_mask, unpack
from qcls.engine.prefix_cache import plan_prefixes
from qcls.scoring.strategies import get_strategy
from qcls.scoring.tokenization import PromptTokens
from qcls.scoring.trie import LabelTrie


def _layout(prefix, suffix, labels, strategy="trie"):
    pt = PromptTokens("p", tuple(f"l{i}" for i in range(len(labels))), prefix, suffix, labels, 99)
    trie = LabelTrie.build(labels, 99)
    plan = get_strategy(strategy).plan(trie)
    return PromptLayout(pt, trie, plan, trie.row_nodes(plan.read_nodes))


def test_rows_positions_reads_and_mask():
    # labels (5,6,7) / (5,6,8) share two tokens then branch; (9,) is single: trie tokens 5, 6 in the row
    lay = _layout((1, 2, 3), (4,), ((5, 6, 7), (5, 6, 8), (9,)))
    assert lay.trie_ids == [5, 6] and lay.trie_depth == [1, 2] and lay.trie_anc == [0b01, 0b11]
    pool = plan_prefixes([lay.tokens.prefix_ids], 16)
    packer = Packer([lay], pool, pool_len=16)
    n = packer.n_tokens(2, 5) + 2  # queries of 2 and 3 tokens, 2 pad tokens
    buf = torch.zeros(packer.buffer_len(2, n), dtype=torch.long)
    packer.pack([[10, 11], [20, 21, 22]], n, buf)
    d = unpack(buf, n, packer.n_reads(2), 1)
    # row 0: 10 11 | 4 | 5 6   row 1: 20 21 22 | 4 | 5 6   pads
    assert d["ids"].tolist() == [10, 11, 4, 5, 6, 20, 21, 22, 4, 5, 6, 0, 0]
    assert d["pos"].tolist()[:5] == [3, 4, 5, 6, 7]  # after the 3-token prefix; trie at suffix end + depth
    assert d["pos"].tolist()[5:11] == [3, 4, 5, 6, 7, 8]
    assert d["read"].tolist() == [2, 4, 8, 10]  # root (the suffix token) and the branching node, per query
    m = build_mask(d, packer.visible, key_len=16 + n + 3)
    own = m[:, 16:16 + n]
    assert m[:11, :3].all() and not m[:, 3:16].any()  # every row sees the prefix's 3 pool slots only
    assert own[2, :3].tolist() == [True, True, True] and not own[2, 3:].any()  # causal, no trie keys
    assert own[4, :5].tolist() == [True, True, True, True, True]  # depth-2 trie token sees its ancestor
    assert not own[3, 4]  # …but the depth-1 token does not see its child
    assert not own[5:11, :5].any() and not own[:5, 5:11].any()  # rows never see each other
    assert not m[11:, :16].any() and own[11:, 11:].equal(torch.eye(2, dtype=torch.bool))  # pads: themselves
    assert not m[:, 16 + n:].any()
    # attention tiles: one per row (5 and 6 tokens ≤ TILE), one for the pads, then unused (count 0)
    tiles = d["tiles"].view(-1, 5).tolist()
    assert tiles[:3] == [[0, 5, 0, 5, 0], [5, 6, 5, 6, 0], [11, 2, 11, 2, 1]]
    assert all(t[1] == 0 for t in tiles[3:]) and len(tiles) == packer.max_tiles(2, n)
    assert packer.prefix_len.tolist() == [3, 0] and packer.pool.prompt_slots(0) == [0, 1, 2]


def test_long_rows_split_into_tiles():
    lay = _layout((1,), (4, 4, 4), ((5,), (6,)))
    packer = Packer([lay, lay], plan_prefixes([(1,), (1,)], 16), pool_len=8)
    n = packer.n_tokens(1, 30)
    buf = torch.zeros(packer.buffer_len(1, n), dtype=torch.long)
    packer.pack([list(range(100, 130))], n, buf)
    tiles = [t for t in unpack(buf, n, packer.n_reads(1), 2)["tiles"].view(-1, 5).tolist() if t[1]]
    # rows of 33 tokens → tiles of 16, 16, 1 each; every token in exactly one tile of its own row
    assert [t[1] for t in tiles] == [16, 16, 1, 16, 16, 1]
    assert [t[2] for t in tiles] == [0, 0, 0, 33, 33, 33] and {t[3] for t in tiles} == {33}
    covered = sorted(i for t in tiles for i in range(t[0], t[0] + t[1]))
    assert covered == list(range(n))


def test_tokens_listed_by_prompt_in_prefix_order():
    """qtok lists every row's tokens prompt after prompt in the pool's prefix order, qstart where each
    prompt's tokens start: the query blocks of the tree kernels' prefix chunks."""
    p0, p1, p2 = (_layout(pre, suf, ((5,), (6,))) for pre, suf in [((9, 9, 1), (4,)), ((7,), (4, 4)), ((9, 9, 2), (4,))])
    pool = plan_prefixes([p.tokens.prefix_ids for p in (p0, p1, p2)], 2)  # blocks (9 9)(1) | (7) | (9 9)(2)
    packer = Packer([p0, p1, p2], pool, pool_len=8)
    assert packer.order == [0, 2, 1]  # p0 and p2 share their first block: neighbours
    n = packer.n_tokens(2, 3) + 3
    buf = torch.zeros(packer.buffer_len(2, n), dtype=torch.long)
    packer.pack([[10], [20, 21]], n, buf)
    d = unpack(buf, n, packer.n_reads(2), 3)
    # rows: q0: p0 [0 1] p1 [2 3 4] p2 [5 6]; q1: p0 [7 8 9] p1 [10 11 12 13] p2 [14 15 16]; 3 pads
    assert d["qtok"].tolist() == [0, 1, 7, 8, 9, 5, 6, 14, 15, 16, 2, 3, 4, 10, 11, 12, 13, 0, 0, 0]
    assert d["qstart"].tolist() == [0, 5, 10, 17]
    assert packer.slot_pos.tolist()[:5] == [0, 1, 2, 0, 2]  # a slot's position in (every) prefix that holds it


def test_sliding_window_mask():
    """window w: a key is visible only if pos(token) - pos(key) < w; pool slots at their prefix index."""
    lay = _layout((1, 2, 3), (4,), ((5, 6, 7), (5, 6, 8), (9,)))
    packer = Packer([lay], plan_prefixes([lay.tokens.prefix_ids], 16), pool_len=8)
    n = packer.n_tokens(1, 2)
    buf = torch.zeros(packer.buffer_len(1, n), dtype=torch.long)
    packer.pack([[10, 11]], n, buf)
    d = unpack(buf, n, packer.n_reads(1), 1)
    key_len = 8 + n
    full = build_mask(d, packer.visible, key_len)
    m = build_mask(d, packer.visible, key_len, 3, packer.slot_pos)
    # tokens: 10 (pos 3), 11 (4), 4 (5), trie 5 (6), trie 6 (7); prefix slots at positions 0, 1, 2
    assert m[0, :3].tolist() == [False, True, True] and m[0, 8]  # pos 3 sees prefix 1, 2 and itself
    assert not m[2, :3].any() and m[2, 8:11].tolist() == [True, True, True]  # pos 5: 3, 4, 5
    assert m[4, 8:13].tolist() == [False, False, True, True, True]  # trie depth 2 (pos 7): 5, 6 and itself
    assert (m <= full).all() and not m.equal(full)  # a window only ever hides keys
    assert build_mask(d, packer.visible, key_len, 100, packer.slot_pos).equal(full)


def test_kept_layouts_give_the_buffer_a_fresh_packer_gives():
    """A batch whose query lengths were seen before (or warmed at start-up) is its kept layout with its own
    ids written in: the same buffer as a fresh packer builds, whatever ids the earlier batch had."""
    import qcls.engine.layout as L
    p0, p1 = _layout((1, 2), (4,), ((5, 6), (5, 7), (9,))), _layout((3,), (4, 4), ((8,), (9,)))
    pool = plan_prefixes([p0.tokens.prefix_ids, p1.tokens.prefix_ids], 4)

    def packed(packer, batch, n):
        buf = torch.full((packer.buffer_len(len(batch), n),), -7, dtype=torch.long)
        packer.pack(batch, n, buf)
        return buf

    kept = Packer([p0, p1], pool, pool_len=8)
    kept.warm([3], kept.n_tokens(1, 3) + 1)
    for batch, slack in [([[10, 11, 12]], 1), ([[20, 21, 22]], 1), ([[1, 2], [3, 4, 5]], 2), ([[6, 7], [8, 9, 10]], 2)]:
        n = kept.n_tokens(len(batch), sum(map(len, batch))) + slack
        assert torch.equal(packed(kept, batch, n), packed(Packer([p0, p1], pool, pool_len=8), batch, n))
    assert len(kept._permanent) == 1 and len(kept._recent) == 1  # the warmed batch-1 layout was used
    old = L.LAYOUTS_KEPT
    try:
        L.LAYOUTS_KEPT = 2
        for lq in (1, 2, 3, 4):
            packed(kept, [[5] * lq, [6]], kept.n_tokens(2, lq + 1))
        assert len(kept._recent) == 2  # bounded: the oldest went first
    finally:
        L.LAYOUTS_KEPT = old


def _reference_layout(packer, lengths, n, tile):
    """The layout built query by query (the build before the vectorised one): each template copied,
    shifted and concatenated in turn, its rows cut into tiles of `tile` tokens here. The slow, obvious version
    the packer's layout must equal."""
    import numpy as np

    from qcls.engine.tree_kernels import TILE_FIELDS
    from qcls.engine.layout import FIELDS, QROW
    n_p = len(packer.prompts)
    cols, reads, tiles, row_start, row_len, where, off = [], [], [], [], [], [], 0
    for qi, lq in enumerate(lengths):
        t = packer._templates[lq]
        where.append((t.query_at + off).reshape(n_p, lq))
        c = t.cols.copy()
        c[2] += qi * n_p
        c[QROW, t.query_at] += qi * n_p
        cols.append(c)
        reads.append(t.reads + off)
        for p, (start, length) in enumerate(zip(t.row_start + off, t.row_len)):
            for first in range(0, length, tile):
                tiles.append(np.array([[start + first, min(tile, length - first), start, length, p]]))
        row_start.append(t.row_start + off)
        row_len.append(t.row_len)
        off += c.shape[1]
    pad = n - off
    pads = np.zeros((len(FIELDS), pad), dtype=np.int64)
    pads[2] = -1 - np.arange(pad)
    pads[5] = -1
    pads[6] = n_p
    pads[QROW] = -1
    cols.append(pads)
    starts = np.arange(off, n, tile, dtype=np.int64)
    cnt = np.minimum(tile, n - starts)
    tiles.append(np.stack([starts, cnt, starts, cnt, np.full_like(starts, n_p)], 1))
    tiles_all = np.concatenate(tiles)
    room = packer.max_tiles(len(lengths), n)
    tiles_all = np.concatenate([tiles_all, np.zeros((room - len(tiles_all), TILE_FIELDS), dtype=np.int64)])
    qtok, qstart = packer._tokens_by_prompt(np.stack(row_start), np.stack(row_len), n)
    flat = np.concatenate([np.concatenate(cols, 1).ravel(), qtok, qstart, *reads, tiles_all.ravel()])
    return flat, where


def test_layout_equals_the_query_by_query_build():
    """The vectorised layout (every template laid at once) against the query-by-query build, on random
    prompts (multi-token tries, rows longer than one tile, one prompt without a prefix) and random batches of
    1-6 queries of 1-40 tokens, with and without padding, in tiles of either size the packer holds."""
    import random

    import numpy as np
    rng = random.Random(0)
    prompts = [_layout(tuple(rng.randrange(100) for _ in range(rng.randrange(0, 12))),
                       tuple(rng.randrange(100) for _ in range(rng.randrange(1, 6))),
                       tuple(sorted({tuple(rng.randrange(50, 70) for _ in range(rng.randrange(1, 4)))
                                     for _ in range(rng.randrange(2, 9))})))
               for _ in range(5)]
    pool = plan_prefixes([p.tokens.prefix_ids for p in prompts], 4)
    packer = Packer(prompts, pool, pool_len=pool.n_slots + (-pool.n_slots) % 8, max_query=40)
    assert packer.tiles == (16, 32)
    for _ in range(60):
        lengths = [rng.randrange(1, 41) for _ in range(rng.randrange(1, 7))]
        n = packer.n_tokens(len(lengths), sum(lengths)) + rng.choice([0, 1, 17, 40])
        tile = rng.choice(packer.tiles)
        got, got_where = packer.layout(lengths, n, tile)
        want, want_where = _reference_layout(packer, lengths, n, tile)
        assert got.shape == want.shape == (packer.buffer_len(len(lengths), n),)
        np.testing.assert_array_equal(got, want)
        assert len(got_where) == len(want_where)
        for g, w in zip(got_where, want_where):
            np.testing.assert_array_equal(g, w)
