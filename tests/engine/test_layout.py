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
    d = unpack(buf, n, packer.n_reads(2))
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
    assert packer.prefix_len.tolist() == [3, 0] and packer.prefix_slots[0, :3].tolist() == [0, 1, 2]


def test_long_rows_split_into_tiles():
    lay = _layout((1,), (4, 4, 4), ((5,), (6,)))
    packer = Packer([lay, lay], plan_prefixes([(1,), (1,)], 16), pool_len=8)
    n = packer.n_tokens(1, 30)
    buf = torch.zeros(packer.buffer_len(1, n), dtype=torch.long)
    packer.pack([list(range(100, 130))], n, buf)
    tiles = [t for t in unpack(buf, n, packer.n_reads(1))["tiles"].view(-1, 5).tolist() if t[1]]
    # rows of 33 tokens → tiles of 16, 16, 1 each; every token in exactly one tile of its own row
    assert [t[1] for t in tiles] == [16, 16, 1, 16, 16, 1]
    assert [t[2] for t in tiles] == [0, 0, 0, 33, 33, 33] and {t[3] for t in tiles} == {33}
    covered = sorted(i for t in tiles for i in range(t[0], t[0] + t[1]))
    assert covered == list(range(n))
