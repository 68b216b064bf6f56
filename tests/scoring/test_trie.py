"""The label trie on hand-made token sequences."""
from __future__ import annotations

import pytest

from qcls.scoring.trie import LabelTrie

END = 99


def test_all_single_tokens():
    t = LabelTrie.build([(1,), (2,), (3,)], END)
    assert len(t.nodes) == 4 and t.child_tokens(0) == [1, 2, 3]
    assert [i for i in range(len(t.nodes)) if t.is_branching(i)] == [0]
    assert t.label_steps(1, with_end=True) == [(0, 2)]
    assert t.row_nodes([0]) == []


def test_shared_prefixes_branch_where_tokens_differ():
    # like ' 女童' / ' 女士' (three shared tokens) and ' 无' / ' 男童' / ' 男士' (a shared bare space)
    t = LabelTrie.build([(4, 5, 6, 7), (4, 5, 6, 8), (2, 9), (2, 10, 11), (2, 12)], END)
    root_children = t.child_tokens(0)
    assert root_children == [4, 2]
    branching = [i for i in range(len(t.nodes)) if t.is_branching(i)]
    depth = {i: t.nodes[i].depth for i in branching}
    assert sorted(depth.values()) == [0, 1, 3]  # root, after '2', after '4 5 6'
    n456 = t.label_paths[0][2]
    assert t.child_tokens(n456) == [7, 8]
    assert t.row_nodes(branching) == sorted(t.label_paths[0][:3] + [t.label_paths[2][0]])
    # a node with a single way forward (10 -> 11) is not branching
    assert not t.is_branching(t.label_paths[3][1])


def test_prefix_of_another_gets_end_child():
    t = LabelTrie.build([(1, 2), (1, 2, 3), (4,)], END)  # "man" vs "man"+"ager"
    last = t.label_paths[0][-1]
    assert t.nodes[last].label == 0 and t.child_tokens(last) == [3, END]
    assert t.label_steps(0, with_end=True) == [(0, 1), (t.label_paths[0][0], 2), (last, END)]
    assert t.label_steps(0, with_end=False) == [(0, 1), (t.label_paths[0][0], 2)]
    assert t.label_steps(1, with_end=True)[-1] == (last, 3)
    assert t.needs_end()


def test_refusals():
    with pytest.raises(ValueError, match="same tokens"):
        LabelTrie.build([(1, 2), (1, 2)], END)
    with pytest.raises(ValueError, match="no eos"):
        LabelTrie.build([(1,), (1, 2)], None)
    with pytest.raises(ValueError, match="end token"):
        LabelTrie.build([(1,), (1, END)], END)
    with pytest.raises(ValueError, match="no tokens"):
        LabelTrie.build([(1,), ()], END)
