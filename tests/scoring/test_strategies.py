"""Every strategy's plan on synthetic logits, against values computed by hand."""
from __future__ import annotations

import math

import pytest
import torch

from qcls.scoring.strategies import apply_plan, get_strategy
from qcls.scoring.trie import LabelTrie

END = 9
# labels: A=(1,), B=(2,3), C=(2,4), D=(2,4,5)  — D extends C, so C gets an end child at node (2,4)
LABELS = [(1,), (2, 3), (2, 4), (2, 4, 5)]
V = 10


def _logits(seed=0):
    """Per trie node, a full-vocabulary logit vector (what the model would output there)."""
    g = torch.Generator().manual_seed(seed)
    t = LabelTrie.build(LABELS, END)
    return t, {i: torch.randn(V, generator=g) * 2 for i in range(len(t.nodes))}


def _run(name, trie, node_logits):
    plan = get_strategy(name).plan(trie)
    x = torch.stack([node_logits[plan.read_nodes[r]][tok] for r, tok in zip(plan.entry_read, plan.entry_token)])
    lse = torch.stack([torch.logsumexp(node_logits[n], 0) for n in plan.read_nodes])
    return plan, apply_plan(plan, x, lse).tolist()


def _lsm(vec, choices, pick):
    sub = torch.tensor([vec[c].item() for c in choices])
    return (sub[choices.index(pick)] - torch.logsumexp(sub, 0)).item()


def test_first_token():
    trie, L = _logits()
    plan, s = _run("first_token", trie, L)
    assert plan.read_nodes == [0]
    assert s == pytest.approx([L[0][1].item(), L[0][2].item(), L[0][2].item(), L[0][2].item()])


def test_trie_by_hand():
    trie, L = _logits()
    n2 = trie.label_paths[1][0]
    n24 = trie.label_paths[2][1]
    root = _lsm(L[0], [1, 2], 1), _lsm(L[0], [1, 2], 2)
    expect = [root[0],
              root[1] + _lsm(L[n2], [3, 4], 3),
              root[1] + _lsm(L[n2], [3, 4], 4) + _lsm(L[n24], [5, END], END),
              root[1] + _lsm(L[n2], [3, 4], 4) + _lsm(L[n24], [5, END], 5)]
    plan, s = _run("trie", trie, L)
    assert s == pytest.approx(expect, abs=1e-6)
    assert sum(math.exp(v) for v in s) == pytest.approx(1.0, abs=1e-6)  # a proper distribution
    assert plan.read_nodes == [0, n2, n24]


def test_exact_and_mean_by_hand():
    trie, L = _logits()
    lp = {i: torch.log_softmax(v, 0) for i, v in L.items()}
    n2 = trie.label_paths[1][0]
    n24 = trie.label_paths[2][1]
    exact = [lp[0][1].item(),
             lp[0][2].item() + lp[n2][3].item(),
             lp[0][2].item() + lp[n2][4].item(),
             lp[0][2].item() + lp[n2][4].item() + lp[n24][5].item()]
    _, s = _run("exact", trie, L)
    assert s == pytest.approx(exact, abs=1e-5)
    _, m = _run("mean_logprob", trie, L)
    assert m == pytest.approx([e / len(lab) for e, lab in zip(exact, LABELS)], abs=1e-5)


def test_single_token_labels_trie_equals_softmax_of_first_token():
    trie = LabelTrie.build([(1,), (2,), (3,)], END)
    L = {0: torch.tensor([0.0, 1.0, 2.0, 3.0] + [0.0] * 6)}
    _, s = _run("trie", trie, L)
    assert s == pytest.approx(torch.log_softmax(torch.tensor([1.0, 2.0, 3.0]), 0).tolist(), abs=1e-6)
    _, f = _run("first_token", trie, L)
    assert f == [1.0, 2.0, 3.0]


def test_unknown_strategy():
    with pytest.raises(ValueError, match="unknown scoring strategy 'greedy'"):
        get_strategy("greedy")
