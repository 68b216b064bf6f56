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
