"""The tail's product of a head's weights with the read states (engine/tail.py `_FeatureProduct`), split into
slices of the hidden size, against the plain per-(query, prompt) product."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qcls.engine.tail import _FeatureProduct
from qcls.heads.head import PromptHead, Read


@pytest.mark.parametrize("hidden", [64, 576, 2560])
@pytest.mark.parametrize("b", [1, 3])
def test_split_feature_product_equals_the_plain_product(hidden, b):
    rng = np.random.default_rng(hidden + b)
    reads = [Read(2, "both"), None, Read("final"), Read(2, "query_mean")]
    label_counts = [3, 2, 5, 4]
    heads = [None if r is None else PromptHead([f"l{i}" for i in range(n)], np.zeros(n), None,
                                               rng.normal(size=(n, hidden * len(r.taps))), r)
             for r, n in zip(reads, label_counts)]
    taps = [Read(2, "both").taps[1], Read("final").taps[0], Read(2, "both").taps[0]]  # any order of the buffer
    n_p = len(heads)
    buf = torch.from_numpy(rng.normal(size=(len(taps), b * n_p + 2, hidden))).float()
    buf[:, -2:] = 0  # the tap buffer's two rows of zeros
    got = _FeatureProduct(heads, taps, b, hidden, label_counts, torch.device("cpu"))(buf)
    want = []
    for q in range(b):
        for p, (h, n) in enumerate(zip(heads, label_counts)):
            if h is None:
                want += [0.0] * n
                continue
            x = torch.cat([buf[taps.index(t), q * n_p + p] for t in h.read.taps]).double().numpy()
            want += list(h.feature_weights @ x)
    assert got.shape == (sum(label_counts) * b,)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("b", [1, 3])
def test_fused_group_normaliser_equals_the_torch_ops(seed, b):
    """engine.fuse_tail: the gather, sibling-group log-sum-exps and subtraction in one kernel (Triton's
    interpreter on a CPU) give the torch path's scores (scoring=trie: the strategy with that normaliser), on
    random tries (labels of one to three tokens, groups of one or more siblings) and random read states."""
    from qcls.engine.kernels import triton
    if triton is None:
        pytest.skip("Triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("the CPU check of the kernel (on a GPU the engine tests run it)")
    import random

    from qcls.engine.tail import Tail
    from qcls.scoring.strategies import get_strategy
    from qcls.scoring.trie import LabelTrie
    rng = random.Random(10 * seed + b)
    plans, tokens = [], set()
    for _ in range(3):
        labels = {tuple(rng.randrange(10, 30) for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(2, 8))}
        plan = get_strategy("trie").plan(LabelTrie.build(tuple(sorted(labels)), 99))
        plans.append(plan)
        tokens |= set(plan.entry_token)
    tokens = sorted(tokens)
    g = torch.Generator().manual_seed(b)
    rows = torch.randn(len(tokens), 16, generator=g)
    tail = Tail(plans, b, rows, tokens, None, 1024, torch.device("cpu"))
    assert tail.normaliser == "group" and tail.members is None  # on a CPU the torch ops run
    h = torch.randn(tail.n_reads, 16, generator=g) * 3
    want = tail(h).clone()
    tail.members = tail.group_members()
    got = tail(h)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    x_want = tail.x1.clone()
    tail.members[:, 0] = tail.members[:, 0].roll(1)  # a wrong table shows: the check can fail
    tail(h)
    assert not torch.allclose(tail.x1, x_want, atol=1e-5)
